"""The project speaks of itself only: no development history, no citations of outside documents.

What is forbidden in the shipped text (the package, the docs, the README, the notebooks, the
benchmarks, the configs and the Makefile):

- numbered sessions or rounds of past work ("session 6", "round 3", "end of session"): git history
  holds how the code came to be. A command-line flag such as `--rounds 3` is not history.
- our own issue and pull-request numbers ("issue 17", "issue-17", "PR 12", "#17"). Another
  project's issue cited as a fact stays allowed when the project is named right before it
  ("AReaL #432", "sglang issue 1046", "owner/repo#12"): the reader can look it up there.
- citations of documents the repository does not hold: the research notes the code was written
  from ("semantics digest", "sglang-contract.md", "shared/reference/...", "seed 003", "the seed's
  example") and bare
  section marks ("§12.11"). A `§` is allowed only right after the path of a Markdown file of the
  repository ("docs/design.md §2"), which the reader can open.

Contracts the code relies on live in docs/reference/ and are cited by their path there.
CSS colours ("#555", "solid #222;") and Markdown headings ("# 1.") are not issue numbers: a `#N` counts only
when it starts a word after a space or an opening bracket and is directly followed by digits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [
    "areal_nb",
    "tests",
    "docs",
    "tutorials",
    "notebooks",
    "benchmarks",
    "configs",
    "README.md",
    "Makefile",
]
SUFFIXES = {".py", ".md", ".ipynb", ".yaml", ".yml", ".sh", ".sbatch", ".txt", ".toml", ""}

# A project named right before an issue/PR number makes it a citation of that project's tracker.
OTHER_PROJECT = re.compile(
    r"(?:AReaL|SGLang|sglang|vLLM|vllm|transformers|PyTorch|pytorch|torch|CPython|uvicorn|httpx|"
    r"starlette|FastAPI|TRL|[\w.-]+/[\w.-]+)\s*(?:issue|PR|pull request)?\s*$",
    re.IGNORECASE,
)

HISTORY = [
    (
        "numbered session or round of past work",
        re.compile(r"(?<![-\w])(?:session|round)s? \d+\b", re.IGNORECASE),
    ),
    ("session of past work", re.compile(r"\bend of (?:the )?session\b", re.IGNORECASE)),
    ("issue or PR number", re.compile(r"\b(?:issues?|PRs?|pull requests?)[ -]#?\d+\b", re.IGNORECASE)),
    # not a CSS colour ("solid #222;", "color:#777")
    ("issue or PR number", re.compile(r"(?:(?<=^)|(?<=[\s(\[]))(?<!solid )(?<!dashed )#\d+\b(?!;)")),
    (
        "citation of an outside document",
        re.compile(
            r"semantics digest|sglang-contract|areal-agentic-semantics|shared/reference|/work/shared|"
            r"scale-out\.md|machine-probe|\bseeds?/|\bseed \d{3}\b|\bthe seed's\b",
            re.IGNORECASE,
        ),
    ),
]
SECTION_MARK = re.compile(r"§")
MD_PATH_BEFORE = re.compile(r"[\w./-]+\.md\s*,?\s*$")


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the matched text) for every piece of history or outside citation."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in HISTORY:
            for m in pattern.finditer(line):
                if what == "issue or PR number" and OTHER_PROJECT.search(line[: m.start()]):
                    continue
                found.append((lineno, what, m.group(0)))
        for m in SECTION_MARK.finditer(line):
            if not MD_PATH_BEFORE.search(line[: m.start()]):
                found.append(
                    (lineno, "section mark without an in-repo document", line[m.start() : m.start() + 8])
                )
    return found


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and p.suffix in SUFFIXES
                and "__pycache__" not in p.parts
                and ".ipynb_checkpoints" not in p.parts
                and p != Path(__file__).resolve()  # (this file spells out what it looks for)
            ]
    return files


@pytest.mark.parametrize(
    "text",
    [
        "measured at the end of session 6 (load 1.1)",
        "the proxy without sockets (issue 14)",
        "Issue 11's acceptance run",
        "see issue-29 for details",
        "fixed in round 3",
        "a regression from #17",
        "(#17)",
        "follows the semantics digest §4.2",
        "sglang-contract.md §1.2 is the source",
        "see shared/reference/areal-agentic-semantics.md",
        "unlike AReaL (§12.11)",
        "seed 003's gsm8k_reward_fn",
        "The seed's multi-turn math agent",
    ],
)
def test_history_is_found(text):
    assert findings(text), text


@pytest.mark.parametrize(
    "text",
    [
        "never mutate the shared prompt (AReaL #432)",
        "fixed upstream in sgl-project/sglang#28001",
        "the layer table of docs/design.md §2",
        "benchmarks/disconnect_watch.py [--requests 500] [--rounds 6]",
        'stroke="#555" and color:#777',
        "border:1.5px solid #222;background:#fff",
        "# 1. Load the model",
        "PEP 8 and PEP 484",
        "this session's interactions",
        "a round of 32 requests",
        "runs with the same seed share the prompt order",
    ],
)
def test_legitimate_text_passes(text):
    assert not findings(text), findings(text)


def test_no_history_in_the_shipped_text():
    files = scanned_files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".ipynb" for p in files)
    problems = [
        f"{p.relative_to(ROOT)}:{lineno}: {what}: {match!r}"
        for p in files
        for lineno, what, match in findings(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not problems, "development history or outside citations:\n" + "\n".join(problems)
