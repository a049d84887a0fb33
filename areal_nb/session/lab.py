"""`session.compare(batch, variants)`: one batch under several algorithms, side by side.

Each variant is a name and a dict of actor knobs. A name that is a preset (`grpo`, `dr_grpo`,
`dapo`, `gspo`, `cispo`, `rloo`, `reinforce_pp`) selects it unless the dict says `algorithm`;
the Session's own actor config supplies every other knob (`train.algorithms.configure`: another
preset brings its own clip ranges). The computation is `train.lab.compare_variants`: no
optimizer step, and the Session's weights, optimizer state and RNG states stay as they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from areal_nb.api.train_batch import TrainBatch
from areal_nb.errors import InvalidArgumentError
from areal_nb.train.algorithms import ALGORITHMS, configure
from areal_nb.train.lab import VariantResult, compare_variants, cosine_matrix


@dataclass
class Comparison:
    """What `compare` returns: `.table` (one row per variant), `.variants` (their per-token
    values, `train.lab.VariantResult`), `.view()` (the token lanes widget); a notebook cell
    shows the table and the widget."""

    variants: dict[str, VariantResult]
    input_ids: Any  # [B, L] (CPU)
    attention_mask: Any
    loss_mask: Any
    rewards: Any
    tokenizer: Any = None

    @property
    def table(self):
        import pandas as pd

        results = list(self.variants.values())
        cosines = cosine_matrix(results)
        records = []
        for i, r in enumerate(results):
            n = max(int(self.loss_mask.sum()), 1)
            record = {
                "variant": r.name,
                "algorithm": r.cfg.algorithm,
                "loss": r.loss,
                "clipped_frac": float(r.clipped.sum()) / n,
                "masked_frac": float(r.masked.sum()) / n,
                "grad_norm": r.grad_norm,
                "adv_abs_mean": float(r.advantages[self.loss_mask].abs().mean()),
                "mismatch_kl_k3": r.stats.get("mismatch_kl_k3", float("nan")),
            }
            if r.trial_kl is not None:
                record["trial_kl"] = r.trial_kl
            for j, other in enumerate(results):
                record[f"cos_{other.name}"] = float(cosines[i, j])
            records.append(record)
        return pd.DataFrame.from_records(records).set_index("variant")

    def view(self, row: int | None = None):
        from areal_nb.widgets.compare_view import CompareView

        return CompareView(self, row=row)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.table)
        display(self.view())


def variant_configs(base: Any, variants: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """name → GRPOConfig for `variants` (name → knob overrides) on top of `base`."""
    if not isinstance(variants, Mapping) or not variants:
        raise InvalidArgumentError(
            "variants must be a non-empty dict of name -> actor knobs, e.g. {'grpo': {}, 'gspo': {}}"
        )
    out = {}
    for name, knobs in variants.items():
        knobs = dict(knobs or {})
        algorithm = knobs.pop("algorithm", name if name in ALGORITHMS else base.algorithm)
        try:
            out[name] = configure(base, algorithm, **knobs)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"variant {name!r}: {e}") from None
    return out


def compare(
    session: Any, batch: Any, variants: Mapping[str, Mapping[str, Any] | None], *, trial_step: bool = False
) -> Comparison:
    """`Session.compare`: `batch` is a RolloutBatch (or the trainer's `TrainBatch`)."""
    tensors = batch if isinstance(batch, TrainBatch) else batch.to_tensors()
    credit = getattr(batch, "credit", None)
    configs = variant_configs(session.actor.cfg, variants)
    results = compare_variants(session.actor, tensors, configs, credit=credit, trial_step=trial_step)
    return Comparison(
        variants={r.name: r for r in results},
        input_ids=tensors.input_ids.cpu(),
        attention_mask=tensors.attention_mask.cpu(),
        loss_mask=(tensors.loss_mask.bool() & tensors.attention_mask).cpu(),
        rewards=tensors.rewards.float().cpu(),
        tokenizer=getattr(batch, "tokenizer", None) or getattr(session, "tokenizer", None),
    )
