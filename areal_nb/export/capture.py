"""The agent's code, as something a fresh process can import: an import path, or `agent.py`.

An agent (class, instance or function) that lives in an importable module travels as its import
path (`"my_pkg.agents.MyAgent"`). One defined in a notebook cell (`__module__ == "__main__"`)
travels as source: its definition is taken from the cells run so far (IPython's input history,
or the script file of a plain `python script.py`), together with what it uses at module level —
the imports, helper functions and classes, and constants — found with `symtable` (the compiler's
own scoping, so a method's local `client` or `self.session` is not mistaken for a global).

What cannot be written as source fails here, naming it: a global holding a live object (a
Session, a lock, a client), a lambda or function that closes over variables, a class defined
inside a function. The writer then imports the result in a fresh process (see `check_imports`).
Source travels, not pickles (as ART and AReaL do): a job must not depend on byte-identical
environments, and the user can read and edit `agent.py`.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import subprocess
import sys
import symtable
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_MODULE = "agent"  # agent.py in the run folder
_MISSING = object()


class ExportError(ValueError):
    """The run cannot be exported; the message names what and why."""


@dataclass
class CapturedAgent:
    workflow: str  # the config's agent.workflow: an import string
    workflow_kwargs: dict[str, Any] | None = None  # set when recovered from an instance
    source: str | None = None  # agent.py, when the code came from notebook cells
    modules: set[str] = field(default_factory=set)  # top-level modules agent.py imports


def capture_workflow(workflow: Any) -> CapturedAgent:
    """`agent.workflow` (string, class, function or instance) → import string (+ agent.py source)."""
    if isinstance(workflow, str):
        return CapturedAgent(workflow=workflow)
    kwargs = None
    target = workflow
    if not (inspect.isclass(workflow) or inspect.isfunction(workflow)):
        target = type(workflow)
        kwargs = _constructor_kwargs(workflow)
    if target.__module__ != "__main__":
        return CapturedAgent(workflow=_import_path(target), workflow_kwargs=kwargs)
    source, modules = _NotebookCode().extract(target.__name__, target)
    return CapturedAgent(workflow=f"{AGENT_MODULE}.{target.__name__}", workflow_kwargs=kwargs,
                         source=source, modules=modules)


def check_imports(folder: Path, workflow: str, *, timeout: float = 120) -> None:
    """Import `workflow` in a fresh interpreter whose working directory is `folder` (as train.py
    runs), and load its config.yaml there, so a missing import or helper fails now, not when
    the job starts."""
    module, _, name = workflow.rpartition(".")
    code = (f"import sys; sys.path.insert(0, '.'); import {module}; getattr({module}, {name!r}); "
            "from areal_nb.config import load_config; load_config('config.yaml')")
    result = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-6:])
        hint = (" agent.py holds the definitions taken from your cells; if something it needs was made "
                "in a way export cannot follow (exec, a loop, star imports), put the code in a file with "
                "%%writefile my_agent.py and pass its import path.") if module == AGENT_MODULE else ""
        raise ExportError(f"the exported agent {workflow!r} does not import in a fresh process:\n{tail}\n{hint}")


# ----------------------------------------------------------------------------- importable objects


def _import_path(obj: Any) -> str:
    module, qualname = obj.__module__, obj.__qualname__
    if "<locals>" in qualname:
        raise ExportError(f"agent.workflow {qualname!r} is defined inside a function: define it at the top "
                          f"level of a cell or module so it can be imported by name")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ExportError(f"agent.workflow {module}.{qualname} cannot be imported back ({exc})") from exc
    if found is not obj:
        raise ExportError(f"agent.workflow {module}.{qualname} imports as a different object (was it redefined?)")
    return f"{module}.{qualname}"


def _constructor_kwargs(instance: Any) -> dict[str, Any]:
    """An agent instance → the kwargs that rebuild it: every `__init__` parameter must be kept
    as an attribute of the same name, holding plain data (config.yaml holds data only)."""
    cls = type(instance)
    params = [p for p in inspect.signature(cls.__init__).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    state = getattr(instance, "__dict__", {})
    kwargs = {}
    for p in params:
        if p.name in state and _is_plain(state[p.name]):
            if p.default is p.empty or state[p.name] != p.default:
                kwargs[p.name] = state[p.name]
        elif p.default is p.empty or p.name in state:
            raise ExportError(
                f"agent.workflow is an instance of {cls.__qualname__} whose argument {p.name!r} cannot be "
                f"recovered as plain data: pass the class and agent.workflow_kwargs instead "
                f"(Session(..., agent__workflow={cls.__qualname__}, agent__workflow_kwargs={{...}}))")
    return kwargs


def _is_plain(value: Any) -> bool:
    """Data `repr` writes and `ast.literal_eval` reads back equal (numbers, strings, lists, dicts ...)."""
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


# ----------------------------------------------------------------------------- code from cells


def _cell_sources() -> list[str]:
    """The code run in `__main__` so far: IPython's cells (magics already turned into Python),
    or the file of a plain script."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        return list(shell.history_manager.input_hist_parsed)
    main_file = getattr(sys.modules["__main__"], "__file__", None)
    if main_file and Path(main_file).is_file():
        return [Path(main_file).read_text()]
    raise ExportError("the agent is defined in __main__ but its source is not available here (no IPython history, "
                      "no script file): put it in a module and pass its import path")


class _NotebookCode:
    """The last top-level statement binding each name in the cells, and the walk from the agent
    through the globals it uses."""

    def __init__(self) -> None:
        self.namespace = vars(sys.modules["__main__"])
        self.bindings: dict[str, tuple[int, ast.stmt, str]] = {}  # name → (order, statement, cell source)
        order = 0
        for source in _cell_sources():
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            for stmt in tree.body:
                order += 1
                for name in _bound_names(stmt):
                    self.bindings[name] = (order, stmt, source)
        self.lines: dict[int, str] = {}  # order → the statement's text in agent.py
        self.generated: dict[str, str] = {}  # name → a line written by export (an import, a constant)
        self.modules: set[str] = set()
        self.done: set[str] = set()

    def extract(self, name: str, obj: Any) -> tuple[str, set[str]]:
        self._need(name, by=None, value=obj)
        head = [line for line in self.generated.values() if line.startswith(("import ", "from "))]
        consts = [line for line in self.generated.values() if not line.startswith(("import ", "from "))]
        body = [self.lines[k] for k in sorted(self.lines)]
        sections = ["\n".join(sorted(head)), "\n".join(consts), "\n\n\n".join(body)]
        return "\n\n\n".join(part for part in sections if part) + "\n", self.modules

    def _need(self, name: str, by: str | None, value: Any = _MISSING) -> None:
        if name in self.done:
            return
        self.done.add(name)
        user = f"{by!r}" if by else "the agent"
        if value is _MISSING:
            if hasattr(builtins, name) and name not in self.bindings:
                return  # a builtin (IPython also puts its own `open`, `exit` ... in the namespace)
            if name not in self.namespace:
                raise ExportError(f"{user} uses {name!r}, which is not defined in the notebook")
            value = self.namespace[name]
        if isinstance(value, types.ModuleType):
            self._import_line(name, value)
        elif inspect.isclass(value) or inspect.isfunction(value):
            if value.__module__ != "__main__":
                self._import_line(name, value)
            else:
                self._definition(name, value, by)
        elif _is_plain(value):
            self.generated[name] = f"{name} = {value!r}"
        elif isinstance(value, re.Pattern):
            self._need_module("re")
            flags = value.flags & ~re.UNICODE  # str patterns carry UNICODE implicitly
            self.generated[name] = f"{name} = re.compile({value.pattern!r}" + (f", {int(flags)})" if flags else ")")
        else:
            raise ExportError(
                f"{user} uses the global {name!r}, a live {type(value).__qualname__} object, which cannot be "
                f"written into agent.py: create it inside the agent (in __init__ or run) or pass plain data")

    def _need_module(self, module: str) -> None:
        self.generated.setdefault(module, f"import {module}")
        self.modules.add(module.split(".")[0])

    def _import_line(self, name: str, value: Any) -> None:
        """The user's own import statement for `name` when there is one, else one written here."""
        binding = self.bindings.get(name)
        if binding is not None and isinstance(binding[1], (ast.Import, ast.ImportFrom)):
            stmt = binding[1]
            alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == name)
            one = type(stmt)(names=[alias], **({"module": stmt.module, "level": stmt.level}
                                                if isinstance(stmt, ast.ImportFrom) else {}))
            self.generated[name] = ast.unparse(one)
        elif isinstance(value, types.ModuleType):
            self.generated[name] = f"import {value.__name__}" + (f" as {name}" if value.__name__ != name else "")
        else:
            path = _import_path(value)
            module, _, qual = path.rpartition(".")
            self.generated[name] = f"from {module} import {qual}" + (f" as {name}" if qual != name else "")
        module = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
        self.modules.add(module.split(".")[0])

    def _definition(self, name: str, value: Any, by: str | None) -> None:
        label = f"{name!r}" + (f" (used by {by!r})" if by else "")
        closure = getattr(value, "__closure__", None)
        if closure:
            free = ", ".join(f"{var!r} ({type(_cell_value(c)).__qualname__})"
                             for var, c in zip(value.__code__.co_freevars, closure, strict=False))
            raise ExportError(f"{label} closes over {free}: a closure's captured objects cannot be written as "
                              f"source. Define it at the top level and pass data as arguments or globals")
        if "<locals>" in value.__qualname__:
            raise ExportError(f"{label} is defined inside a function; define it at the top level of a cell")
        binding = self.bindings.get(name)
        if binding is None:
            raise ExportError(f"the source of {label} was not found in the notebook's cells")
        order, stmt, source = binding
        if value.__name__ == "<lambda>" and not (isinstance(stmt, (ast.Assign, ast.AnnAssign))
                                                  and isinstance(stmt.value, ast.Lambda)):
            raise ExportError(f"the lambda {label} is not a plain `name = lambda ...` statement")
        text = _segment(source, stmt)
        self.lines[order] = text
        for used in sorted(_global_names(text) - {name}):
            self._need(used, by=name)


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [stmt.target.id]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"]
    return []


def _segment(source: str, stmt: ast.stmt) -> str:
    """The statement's text, decorators included."""
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    lines = source.splitlines()[first - 1: stmt.end_lineno]
    return "\n".join(lines)


def _global_names(source: str) -> set[str]:
    """Names the code reads from module level (symtable: what the compiler resolves as global)."""
    top = symtable.symtable(source, "<export>", "exec")
    names = {s.get_name() for s in top.get_symbols() if s.is_referenced()}

    def walk(table: symtable.SymbolTable) -> None:
        for child in table.get_children():
            names.update(s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced())
            walk(child)

    walk(top)
    return names
