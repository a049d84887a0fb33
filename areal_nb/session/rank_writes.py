"""A Session's writes under torchrun: every rank gathers, rank 0 writes, the others wait for it.

`save`, `save_pretrained` and `export` are called on every rank (the same script runs
everywhere). Under FSDP the weights are in shards, so every rank takes part in gathering the full
tensors; rank 0 alone writes the folder (the replicas are equal), and the other ranks return its
path once it is complete (`Ranks.written_by_rank_0`: a "saved" message, or rank 0's error). In one
process this is the plain write.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_nb.errors import ExportError

from .checkpoint import save_checkpoint

if TYPE_CHECKING:
    from areal_nb.config import SessionConfig

    from .parallel import Ranks
    from .session import Session


def save(session: Session, ranks: Ranks, path: str | Path) -> Path:
    actor = session.actor
    actor_state = actor.state_dict()  # every rank: FSDP gathers the full tensors
    ref_weights = actor.ref_weights()  # (likewise; None without kl_ctl)
    return ranks.written_by_rank_0(
        lambda: save_checkpoint(session, path, actor_state, ref_weights, run=session.run_state())
    )


def save_pretrained(
    session: Session, ranks: Ranks, path: str | Path, *, merged: bool, agent: str | None
) -> Path:
    from .hf_export import save_pretrained as write_folder

    write, actor = ranks.written_by_rank_0, session.actor
    if session.config.agents or agent is not None:  # (agent adapters do not shard: nothing to gather)
        return write(lambda: write_folder(session, path, merged=merged, agent=agent))
    if not merged and not actor.lora:
        raise ExportError(
            "save_pretrained(merged=False) writes a LoRA adapter; this run trains full weights "
            "(no actor.lora): use merged=True"
        )
    # every rank: FSDP gathers them (LoRA: base + ΔW merged, or the adapter alone)
    weights = actor.policy_weights() if merged else actor.adapter_weights()
    return write(lambda: write_folder(session, path, merged=merged, weights=weights))


def export(
    session: Session,
    ranks: Ranks,
    path: str | Path,
    config: SessionConfig,
    *,
    checkpoint: bool,
    overwrite: bool,
) -> Path:
    from areal_nb.export import export_run

    gathered: tuple[dict[str, Any], dict[str, Any] | None] | None = None
    if checkpoint and ranks.channel is not None:
        gathered = (session.actor.state_dict(), session.actor.ref_weights())  # every rank: the gathers
    return ranks.written_by_rank_0(
        lambda: export_run(
            path, config, session=session, checkpoint=checkpoint, overwrite=overwrite, gathered=gathered
        )
    )
