"""`export_run`: write a self-contained run folder from a config (and a live Session).

The folder is built in a temporary sibling and renamed into place at the end, so a run that
cannot be exported (its agent, a dataset, a config value) leaves nothing behind. Contents and
what runs where: templates/README.md. Paths in config.yaml are relative to the folder
(train.py changes into it), so the folder can be copied to a cluster as it is.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import sys
import tempfile
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_nb.config import SessionConfig, dump_config, load_config
from areal_nb.data import is_row_file, load_rows, write_jsonl

from .capture import (
    AGENT_MODULE,
    ExportError,
    capture_workflow,
    check_imports,
    is_plain_data,
    local_import_paths,
)
from .provenance import git_description, package_version, requirements

if TYPE_CHECKING:
    from areal_nb.session import Session

_TEMPLATES = Path(__file__).parent / "templates"
# what an export writes (besides copies of the user's modules); the rest of a folder is not its own
EXPORT_ENTRIES = frozenset(
    {
        "config.yaml",
        "train.py",
        "launch_local.sh",
        "job.sbatch",
        "README.md",
        "requirements.txt",
        f"{AGENT_MODULE}.py",
        "data",
        "checkpoint",
    }
)
logger = logging.getLogger(__name__)


def export_run(
    path: str | Path,
    config: SessionConfig,
    *,
    session: Session | None = None,
    checkpoint: bool = True,
    command: str | None = None,
    overwrite: bool = False,
    gathered: tuple[dict[str, Any], dict[str, Any] | None] | None = None,
) -> Path:
    """Write the run folder at `path` and return it; `session` adds `checkpoint/` (when
    `checkpoint`), and is where an agent defined in notebook cells is found. `gathered`: the
    actor's state and KL reference weights when every rank already took part in gathering them
    (`Session.export` under torchrun); otherwise the checkpoint gathers them here."""
    out = Path(path).expanduser().resolve()  # (a link to a folder elsewhere: work beside its target)
    for parent in out.parents:  # the nearest existing folder above must be a folder
        if parent.exists():
            if not parent.is_dir():
                raise ExportError(f"cannot write the run folder {out}: {parent} is a file, not a folder")
            break
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()):
        if not (overwrite and (out / "train.py").exists() and (out / "config.yaml").exists()):
            raise ExportError(
                f"{out} exists and is not empty"
                + ("" if overwrite else "; pass overwrite=True (--overwrite) to replace an earlier export")
            )
    captured = capture_workflow(
        config.agent.workflow, config.agent.workflow_kwargs
    )  # before anything is written
    # a new config (not a deep copy: the notebook's agent object may hold worker pools or locks)
    cfg = load_config(
        config, {"agent.workflow": captured.workflow, "agent.workflow_kwargs": captured.workflow_kwargs or {}}
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _place_data(cfg, tmp)
        _check_plain(cfg)
        dump_config(cfg, tmp / "config.yaml")
        if captured.source is not None:
            (tmp / f"{AGENT_MODULE}.py").write_text(_agent_header() + captured.source)
        named = local_import_paths(cfg.agent.workflow_kwargs, cfg.data.source, cfg.data.eval_source)
        captured.modules.update(re.split("[.:]", p)[0] for p in named)
        for local in captured.local_modules():  # the user's own modules, beside train.py
            # (agent.py itself travels when the run was exported before: its workflow is agent.<Name>)
            if (local.name in EXPORT_ENTRIES or local.stem == "train") and local.name != f"{AGENT_MODULE}.py":
                raise ExportError(
                    f"the run needs your module {local}, whose name the run folder uses for its "
                    f"own {local.name}: rename the module"
                )
            if local.is_dir():
                shutil.copytree(local, tmp / local.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(local, tmp / local.name)
        saved = session is not None and checkpoint
        if session is not None and checkpoint:
            _save_checkpoint(session, cfg, tmp / "checkpoint", gathered, final=out / "checkpoint")
        _write_launchers(tmp, cfg)
        (tmp / "requirements.txt").write_text(requirements(cfg.agent.workflow, captured.modules))
        _write_readme(
            tmp, cfg, captured.source is not None, saved, session, command or f"session.export({str(path)!r})"
        )
        check_imports(tmp, captured.workflow, also=named)  # and config.yaml loads, in a fresh process
        if out.exists():
            _replace_export(out, tmp)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _replace_export(out: Path, new: Path) -> None:
    """Put the new export's files in place of the earlier export's (including what the new one
    does not write: a stale agent.py or checkpoint/ would change what the job runs) and keep
    everything else in `out`: the results of a job that ran there (runs/, logs/, slurm-*.out)
    and the user's own files are not the export's to delete."""
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    for entry in out.iterdir():
        if entry.name in EXPORT_ENTRIES or (new / entry.name).exists():
            entry.rename(old / entry.name)
    for entry in new.iterdir():
        entry.rename(out / entry.name)
    new.rmdir()
    shutil.rmtree(old)


# ----------------------------------------------------------------------------- config and data


def _place_data(cfg: SessionConfig, folder: Path) -> None:
    """Datasets given as Python objects become data/<split>.jsonl; local files are copied into
    data/; both are referenced relative to the folder. A dataset folder (GSM8K layout) is
    referenced by absolute path, a hub name or "generated" as it is."""
    for field, name in (("source", "train"), ("eval_source", "eval")):
        value = getattr(cfg.data, field)
        if isinstance(value, (str, Path)) and is_row_file(value) and not Path(value).expanduser().is_file():
            raise ExportError(
                f"data.{field} {value!r} is not a file (looked in {Path.cwd()}): the run folder "
                f"must carry its data, give the file's path"
            )
        if value is None or (isinstance(value, str) and not Path(value).expanduser().exists()):
            continue  # "generated", a hub name, a row factory ("my_data:rows": its module travels)
        if isinstance(value, (str, Path)):
            src = Path(value).expanduser()
            if src.is_dir():
                setattr(cfg.data, field, str(src.resolve()))
                continue
            dest = folder / "data" / f"{name}{src.suffix}"
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dest)
        else:
            rows = load_rows(value, name=f"data.{field}")
            dest = write_jsonl(rows, folder / "data" / f"{name}.jsonl", name=f"data.{field}")
            cfg.data.format = "rows"
        setattr(cfg.data, field, dest.relative_to(folder).as_posix())


def _check_plain(cfg: SessionConfig) -> None:
    """config.yaml holds data only: a function or object among the agent's kwargs cannot go there."""
    for key, value in cfg.agent.workflow_kwargs.items():
        if not is_plain_data(value):
            raise ExportError(
                f"agent.workflow_kwargs[{key!r}] is a {type(value).__qualname__}, which config.yaml "
                f"cannot hold: refer to it from the agent's code instead, or pass plain data"
            )


def _save_checkpoint(
    session: Session,
    cfg: SessionConfig,
    path: Path,
    gathered: tuple[dict[str, Any], dict[str, Any] | None] | None,
    *,
    final: Path,
) -> None:
    """`session.save(path)`, recording the exported config (the agent as its import string) and
    the model folder where it will be (`final`), not in the temporary folder it is written to."""
    from areal_nb.session.checkpoint import save_checkpoint

    waiting = session.executor.n_waiting if session.executor is not None else 0
    if waiting:  # the checkpoint's data position is before them (session/checkpoint.py): no row is lost
        logger.info(
            "%d prefetched rollout group(s) were not trained on: the exported run generates them "
            "again from their rows, at its own policy version",
            waiting,
        )
    run = session.run_state()  # the run's progress, as its save() records it
    save_checkpoint(session, path, *(gathered or ()), run=run, config=cfg, model_path=final / "model")


# ----------------------------------------------------------------------------- scripts


def _render(name: str, values: dict[str, Any]) -> str:
    text = (_TEMPLATES / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    return "\n".join(line for line in text.split("\n") if line != "<drop>")


def _write_launchers(folder: Path, cfg: SessionConfig) -> None:
    cluster = cfg.cluster
    (folder / "train.py").write_text((_TEMPLATES / "train.py").read_text())
    local = folder / "launch_local.sh"
    local.write_text(_render("launch_local.sh", {"NPROC": cluster.nproc_per_node}))
    sbatch = folder / "job.sbatch"
    sbatch.write_text(
        _render(
            "job.sbatch",
            {
                "JOB_NAME": _job_name(cfg.experiment_name),
                "NODES": cluster.nodes,
                "CPUS_PER_NODE": cluster.cpus_per_node,
                "TIME": cluster.time,
                "GPU_LINE": f"#SBATCH --gpus-per-node={cluster.gpus_per_node}"
                if cluster.gpus_per_node
                else "<drop>",
                "PARTITION_LINE": f"#SBATCH --partition={cluster.partition}"
                if cluster.partition
                else "<drop>",
                "ACCOUNT_LINE": f"#SBATCH --account={cluster.account}" if cluster.account else "<drop>",
                "INFER_NODES": cluster.infer_nodes,
                "SERVERS_PER_NODE": cluster.servers_per_node,
                "GPUS_PER_NODE": cluster.gpus_per_node,
                "GPUS_PER_SERVER": cfg.engine.launch.gpus_per_server,
                "TP_SIZE": cfg.engine.launch.tp_size,
                "DP_SIZE": cfg.engine.launch.dp_size,
                "NPROC_PER_NODE": cluster.nproc_per_node,
                "ENGINE_PORT": cluster.engine_port,
                "RDZV_PORT": cluster.rdzv_port,
                "MODEL": _bash_word(cfg.model.path),
                "DTYPE": cfg.model.dtype,
                "MAX_BATCH": cfg.engine.max_batch_size,
                "LORA_ARGS": _lora_server_args(cfg),
            },
        )
    )
    for script in (local, sbatch):
        script.chmod(0o755)


def _lora_server_args(cfg: SessionConfig) -> str:
    """The servers' LoRA flags as bash words (`actor.lora`: the policy's adapter; `agents`: every
    agent's), the ones the Session passes to servers it launches; empty without LoRA."""
    from areal_nb.engine.launcher import lora_server_args
    from areal_nb.session.builder import servers_lora

    lora, adapters = servers_lora(cfg)
    if lora is None:
        return ""
    per_batch = {} if adapters is None else {"adapters_per_batch": adapters}
    return " ".join(shlex.quote(a) for a in lora_server_args(lora.r, lora.target_modules, **per_batch))


def _bash_word(value: str) -> str:
    """`value` as one bash word: in double quotes, as a user would write it, unless it holds
    what bash expands or ends there ($, `, \\, "); then in shlex's single quotes."""
    return f'"{value}"' if re.fullmatch(r'[^"$`\\\n]*', value) else shlex.quote(value)


def _job_name(experiment_name: str) -> str:
    """The experiment's name as a Slurm job name inside `#SBATCH --job-name="..."`: sbatch reads
    that line itself (no shell), splitting at spaces outside quotes and knowing no escapes, so a
    quote or a line break cannot be written there; they become '_'."""
    return re.sub(r'["\\\x00-\x1f\x7f]', "_", experiment_name)


def _agent_header() -> str:
    return textwrap.dedent(f'''\
        """The agent and reward code of this run, taken from the notebook's cells by areal-nb export
        ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC): the definitions the agent uses, with their
        imports and module-level helpers. Edit freely; config.yaml names the agent as agent.<Name>."""

        ''')


def _write_readme(
    folder: Path, cfg: SessionConfig, from_cells: bool, saved: bool, session: Any, command: str
) -> None:
    import torch

    cluster = cfg.cluster
    checkpoint = (
        f"step {session.step_count}, policy version {session.version}, data position "
        f"{session.run_state().data_pos}"  # as the checkpoint records it
        if saved
        else "none (training starts from `model.path`)"
    )
    (folder / "README.md").write_text(
        _render(
            "README.md",
            {
                "EXPERIMENT": cfg.experiment_name,
                "COMMAND": command,
                "DATE": f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
                "AREAL_VERSION": package_version("areal_nb"),
                "GIT": git_description(),
                "PYTHON_VERSION": sys.version.split()[0],
                "TORCH_VERSION": torch.__version__,
                "WORKFLOW": cfg.agent.workflow,
                "AGENT_ORIGIN": "from notebook cells, in agent.py" if from_cells else "imported by path",
                "CHECKPOINT": checkpoint,
                "NPROC": cluster.nproc_per_node,
                "NODES": cluster.nodes,
                "INFER_NODES": cluster.infer_nodes,
                "GPUS": cluster.gpus_per_node,
                "TIME": cluster.time,
                "PARTITION": cluster.partition or "default",
            },
        )
    )
