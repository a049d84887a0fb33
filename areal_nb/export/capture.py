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
import importlib.util
import inspect
import re
import subprocess
import symtable
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_nb.api import import_object

from .instance import rebuild_kwargs
from .plain import ExportError, is_code, is_plain_data

AGENT_MODULE = "agent"  # agent.py in the run folder
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_][\w.]*")  # pkg.mod.name, pkg.mod:Name
_MISSING = object()


@dataclass
class CapturedAgent:
    workflow: str  # the config's agent.workflow: an import string
    workflow_kwargs: dict[str, Any] | None = None  # the config's agent.workflow_kwargs (plain data)
    source: str | None = None  # agent.py, when the code came from notebook cells
    modules: set[str] = field(default_factory=set)  # top-level modules the agent's code imports

    def local_modules(self) -> list[Path]:
        """Files or package folders of the user's own modules the agent needs (a `%%writefile
        my_agent.py` beside the notebook): not installed, so they are copied into the run folder."""
        names = set(self.modules) | {self.workflow.split(".")[0]}
        if self.source is not None:  # agent.py is written from the cells, not copied
            names.discard(AGENT_MODULE)
        return sorted(p for p in (_local_path(name) for name in names) if p is not None)


def local_import_paths(*values: Any) -> list[str]:
    """The strings among `values` (nested in lists and dicts too) that name code in the user's own
    modules: `"my_rewards.score"`, `"my_data:rows"` (a reward, a row factory). The run needs
    those modules; an installed package's path or any other text is left alone."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif (
            isinstance(value, str)
            and _IMPORT_PATH.fullmatch(value)
            and _local_path(re.split("[.:]", value)[0])
            and _imports(value)
        ):
            found.append(value)

    for value in values:
        walk(value)
    return found


def _imports(path: str) -> bool:
    """Does `path` name an object here? A file name such as `"config.yaml"` or `"rows.jsonl"`
    looks like an import path when a `config.py` or `rows.py` sits beside the notebook."""
    try:
        import_object(path)
    except Exception:  # noqa: BLE001 - any failure means: not code this run names
        return False
    return True


def capture_workflow(workflow: Any, workflow_kwargs: dict[str, Any] | None = None) -> CapturedAgent:
    """`agent.workflow` (string, class, function or instance) and its kwargs → an import string
    and plain kwargs for config.yaml, plus agent.py when code comes from `__main__`.

    An instance is rebuilt from its constructor arguments. When those include code (a reward
    function: `ChatAgent(reward_fn=my_reward)`), config.yaml cannot hold them: agent.py then
    builds the agent as the notebook did (`AGENT = ChatAgent(reward_fn=my_reward)`) and the
    config names `agent.AGENT`.
    """
    if isinstance(workflow, str):
        return CapturedAgent(workflow=workflow, workflow_kwargs=workflow_kwargs)
    target, kwargs = workflow, workflow_kwargs
    if not (inspect.isclass(workflow) or inspect.isfunction(workflow)):
        target, kwargs = type(workflow), rebuild_kwargs(workflow)
    code_args = {k: v for k, v in (kwargs or {}).items() if _code_in(v)}
    if target.__module__ != "__main__" and not code_args:
        return CapturedAgent(workflow=_import_path(target), workflow_kwargs=kwargs)
    notebook = _NotebookCode()
    for value in [target, *(code for v in code_args.values() for code in _code_in(v))]:
        notebook.add(value)
    if not code_args:
        source, modules = notebook.render()
        return CapturedAgent(
            workflow=f"{AGENT_MODULE}.{target.__name__}",
            workflow_kwargs=kwargs,
            source=source,
            modules=modules,
        )
    args = ", ".join(f"{k}={_source_of(v)}" for k, v in (kwargs or {}).items())
    source, modules = notebook.render(
        f"# the agent of this run, built as the notebook built it\nAGENT = {target.__name__}({args})"
    )
    return CapturedAgent(workflow=f"{AGENT_MODULE}.AGENT", workflow_kwargs={}, source=source, modules=modules)


def check_imports(folder: Path, workflow: str, *, also: Sequence[str] = (), timeout: float = 120) -> None:
    """Import `workflow` in a fresh interpreter whose working directory is `folder` (as train.py
    runs), and load its config.yaml there, so a missing import or helper fails now, not when
    the job starts. `also`: more import paths the run names (a reward, a row factory)."""
    module, _, name = workflow.rpartition(".")
    code = (
        f"import sys; sys.path.insert(0, '.'); import {module}; getattr({module}, {name!r}); "
        f"from areal_nb.api import import_object; [import_object(p) for p in {list(also)!r}]; "
        "from areal_nb.config import load_config; load_config('config.yaml')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-6:])
        hint = (
            (
                " agent.py holds the definitions taken from your cells; if something it needs was made "
                "in a way export cannot follow (exec, a loop, star imports), put the code in a file with "
                "%%writefile my_agent.py and pass its import path."
            )
            if module == AGENT_MODULE
            else ""
        )
        raise ExportError(
            f"the exported agent {workflow!r} does not import in a fresh process:\n{tail}\n{hint}"
        )


# ----------------------------------------------------------------------------- importable objects


def _local_path(module_name: str) -> Path | None:
    """Where a top-level module lives when it is the user's own code: not the standard library,
    not an installed package (site-packages), not areal_nb."""
    import site
    import sysconfig

    if module_name in ("__main__", "areal_nb") or module_name in sys.stdlib_module_names:
        return None
    try:
        spec = importlib.util.find_spec(module_name)  # a top-level name: found without importing it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    path = Path(spec.origin).resolve()
    installed = [
        Path(p).resolve()
        for p in [
            *site.getsitepackages(),
            site.getusersitepackages(),
            sysconfig.get_paths()["stdlib"],
            sysconfig.get_paths()["purelib"],
        ]
    ]
    if any(path.is_relative_to(root) for root in installed):
        return None
    return path.parent if path.name == "__init__.py" else path


def _import_path(obj: Any) -> str:
    module, qualname = obj.__module__, obj.__qualname__
    if "<locals>" in qualname:
        raise ExportError(
            f"agent.workflow {qualname!r} is defined inside a function: define it at the top "
            f"level of a cell or module so it can be imported by name"
        )
    try:
        found = import_object(f"{module}:{qualname}")
    except ImportError as exc:
        raise ExportError(f"agent.workflow {module}.{qualname} cannot be imported back ({exc})") from exc
    if found is not obj:
        raise ExportError(
            f"agent.workflow {module}.{qualname} imports as a different object (was it redefined?)"
        )
    return f"{module}.{qualname}"


def _code_in(value: Any) -> list[Any]:
    """The functions and classes in `value` (itself, or nested in its dicts, lists and tuples)."""
    if is_code(value):
        return [value]
    if isinstance(value, dict):
        return [code for v in value.values() for code in _code_in(v)]
    if type(value) in (list, tuple):
        return [code for v in value for code in _code_in(v)]
    return []


def _source_of(value: Any) -> str:
    """`value` as Python source for agent.py: code by its name (agent.py defines or imports it)."""
    if is_code(value):
        return value.__name__
    if isinstance(value, dict) and _code_in(value):
        return "{" + ", ".join(f"{k!r}: {_source_of(v)}" for k, v in value.items()) + "}"
    if type(value) in (list, tuple) and _code_in(value):
        items = ", ".join(_source_of(v) for v in value)
        return f"[{items}]" if type(value) is list else f"({items}{',' if len(value) == 1 else ''})"
    return repr(value)


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
    return []  # no source: a definition from __main__ then fails, naming itself


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

    def add(self, obj: Any) -> None:
        """`obj` (a class or function) by name in agent.py: its source from the cells, or an import."""
        self._need(obj.__name__, by=None, value=obj)

    def render(self, tail: str = "") -> tuple[str, set[str]]:
        """agent.py: imports, constants, the definitions in the order the cells made them, `tail`."""
        head = [line for line in self.generated.values() if line.startswith(("import ", "from "))]
        consts = [line for line in self.generated.values() if not line.startswith(("import ", "from "))]
        body = [self.lines[k] for k in sorted(self.lines)]
        sections = ["\n".join(sorted(head)), "\n".join(consts), "\n\n\n".join(body), tail]
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
        elif is_plain_data(value):
            self.generated[name] = f"{name} = {value!r}"
        elif isinstance(value, re.Pattern):
            self._need_module("re")
            flags = value.flags & ~re.UNICODE  # str patterns carry UNICODE implicitly
            self.generated[name] = f"{name} = re.compile({value.pattern!r}" + (
                f", {int(flags)})" if flags else ")"
            )
        else:
            raise ExportError(
                f"{user} uses the global {name!r}, a live {type(value).__qualname__} object, which cannot be "
                f"written into agent.py: create it inside the agent (in __init__ or run) or pass plain data"
            )

    def _need_module(self, module: str) -> None:
        self.generated.setdefault(module, f"import {module}")
        self.modules.add(module.split(".")[0])

    def _import_line(self, name: str, value: Any) -> None:
        """The user's own import statement for `name` when there is one, else one written here."""
        binding = self.bindings.get(name)
        if binding is not None and isinstance(binding[1], (ast.Import, ast.ImportFrom)):
            stmt = binding[1]
            alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == name)
            one: ast.Import | ast.ImportFrom = (
                ast.ImportFrom(module=stmt.module, names=[alias], level=stmt.level)
                if isinstance(stmt, ast.ImportFrom)
                else ast.Import(names=[alias])
            )
            self.generated[name] = ast.unparse(one)
        elif isinstance(value, types.ModuleType):
            self.generated[name] = f"import {value.__name__}" + (
                f" as {name}" if value.__name__ != name else ""
            )
        else:
            path = _import_path(value)
            module, _, qual = path.rpartition(".")
            self.generated[name] = f"from {module} import {qual}" + (f" as {name}" if qual != name else "")
        module = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
        self.modules.add(module.split(".")[0])

    def _definition(self, name: str, value: Any, by: str | None) -> None:
        label = f"{name!r}" + (f" (used by {by!r})" if by else "")
        binding = self.bindings.get(name)
        # A decorated def's closure is the decorator's (functools.wraps and the like): agent.py
        # runs the decorated definition again, so the closure is rebuilt, not written down.
        decorated = binding is not None and bool(getattr(binding[1], "decorator_list", None))
        closure = getattr(value, "__closure__", None)
        if closure and not decorated:
            free = ", ".join(
                f"{var!r} ({type(_cell_value(c)).__qualname__})"
                for var, c in zip(value.__code__.co_freevars, closure, strict=False)
            )
            raise ExportError(
                f"{label} closes over {free}: a closure's captured objects cannot be written as "
                f"source. Define it at the top level and pass data as arguments or globals"
            )
        if "<locals>" in value.__qualname__ and not decorated:
            raise ExportError(f"{label} is defined inside a function; define it at the top level of a cell")
        if binding is None:
            raise ExportError(
                f"the source of {label} was not found in the notebook's cells (or the script): "
                f"put it in a module and pass its import path"
            )
        order, stmt, source = binding
        if value.__name__ == "<lambda>" and not (
            isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Lambda)
        ):
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
    lines = source.splitlines()[first - 1 : stmt.end_lineno]
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
