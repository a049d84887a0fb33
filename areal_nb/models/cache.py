"""On-disk cache for built artifacts: one folder per recipe hash, built atomically.

Concurrent processes (parallel test workers, a notebook and a CLI) may ask for the same
artifact at once: an exclusive file lock serialises the builders, each build goes to a
temporary folder first, and an atomic rename publishes it, so nobody sees half a build.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """`$AREAL_NB_CACHE`, else `~/.cache/areal_nb`."""
    env = os.environ.get("AREAL_NB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "areal_nb"


def recipe_hash(recipe: dict[str, Any], source_files: list[Path]) -> str:
    """Short hash of a build recipe and the code that executes it (so code changes rebuild)."""
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for path in source_files:
        h.update(path.name.encode())
        h.update(_source_fingerprint(path))
    return h.hexdigest()[:16]


def _source_fingerprint(path: Path) -> bytes:
    """What of a source file can change a build: a Python file's syntax tree without docstrings
    (comments, docstrings and layout do not count; nor does a string standing alone as a statement
    anywhere, such as an attribute's docstring under a config field), written out the same way on
    every Python from 3.11 on; any other file's bytes."""
    if path.suffix != ".py":
        return path.read_bytes()
    return _canonical(ast.parse(path.read_text(encoding="utf-8"))).encode()


# Fields newer Pythons add with an empty default (3.12: type_params), or that hold no code.
_SKIPPED_FIELDS = {"type_comment", "type_params", "type_ignores", "kind"}


def _canonical(node: Any) -> str:
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):  # statements that are only a string do nothing
                value = [v for v in value if not _is_docstring(v)]
            if value is None or value == [] or name in _SKIPPED_FIELDS:
                continue
            fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)


def _is_docstring(statement: ast.AST) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


@contextmanager
def _locked(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_build(final_dir: Path, build: Callable[[Path], object]) -> Path:
    """Return `final_dir`, running `build(tmp_dir)` and publishing it first if it is missing."""
    if final_dir.is_dir():
        return final_dir
    with _locked(final_dir.with_name(final_dir.name + ".lock")):
        if final_dir.is_dir():  # another process built it while we waited
            return final_dir
        # Holding the lock, any temp folder of this artifact is from a builder that was killed.
        for stale in final_dir.parent.glob(final_dir.name + ".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=final_dir.name + ".tmp-", dir=final_dir.parent))
        try:
            build(tmp)
            os.rename(tmp, final_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final_dir
