"""Where an exported run came from: package versions, the git commit, and requirements.txt."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

# What every exported run imports, besides the agent's own modules.
_CORE = ("areal_nb", "torch", "transformers", "tokenizers", "openai", "httpx", "pyyaml", "cloudpickle")


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def git_description() -> str:
    """`commit abc1234` (+ `, uncommitted changes`) of the areal_nb checkout, or `no git checkout`."""
    where = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "no git checkout"
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "no git checkout"
    return f"git commit {head.stdout.strip()}" + (", with uncommitted changes" if dirty else "")


def requirements(workflow: str, agent_modules: set[str]) -> str:
    """Pinned `name==version` lines: the core packages and the distributions that provide the
    modules the agent imports (stdlib and unknown modules are left out)."""
    providers = metadata.packages_distributions()
    modules = set(agent_modules) | {workflow.split(".")[0]}
    names = list(_CORE)
    for module in sorted(modules):
        if module in sys.stdlib_module_names:
            continue
        names += [d for d in providers.get(module, []) if d not in names]
    lines = [
        f"# installed versions when this run was exported ({sys.version.split()[0]}); "
        "areal_nb: see README.md for its git commit"
    ]
    for name in names:
        version = package_version(name)
        if version != "not installed":
            lines.append(f"{name}=={version}")
    return "\n".join(lines) + "\n"
