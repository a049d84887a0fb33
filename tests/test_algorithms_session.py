"""The algorithms on a real Session (tiny model, real engine and proxy): the lab leaves the
Session as it was and agrees with each variant's own train step; the mismatch metrics reach the
history and the dashboard; DAPO's preset refills and counts in `step()`."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.config import load_config
from areal_nb.train import Actor
from areal_nb.widgets.dashboard_model import history_series

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = {
    "rollout__batch_size": 2,
    "rollout__group_size": 3,
    "logging__progress": False,
    "rollout__prefetch": False,
}


def config(**kw):
    overrides = {**SMALL, **kw}
    return load_config(CONFIG, [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()])


def rollout_with_spread(session: Session, tries: int = 6):
    """A batch whose rewards are not all equal (equal rewards leave every variant's advantage,
    and so its gradient, at zero). With 2 groups of 3 on the warm-started model a batch of equal
    rewards is common; six tries leave that to well under 1 %."""
    for _ in range(tries):
        batch = session.rollout()
        if batch.to_tensors().rewards.unique().numel() > 1:
            return batch
    raise AssertionError(f"{tries} batches in a row had equal rewards")


def test_compare_leaves_the_session_untouched_and_matches_each_variants_train_step():
    with Session(config()) as session:
        batch = rollout_with_spread(session)
        actor = session.actor
        weights = copy.deepcopy(actor.model.state_dict())
        optimizer = copy.deepcopy(actor.optimizer.state_dict())
        rng = (random.getstate(), torch.get_rng_state())
        variants = {"grpo": {}, "dr_grpo": {}, "gspo": {}, "cispo": {}, "rloo": {}, "reinforce_pp": {}}
        comparison = session.compare(batch, variants, trial_step=True)
        assert all(torch.equal(weights[k], v) for k, v in actor.model.state_dict().items())
        assert actor.optimizer.state_dict()["state"] == {} and optimizer["state"] == {}
        assert random.getstate() == rng[0] and torch.equal(torch.get_rng_state(), rng[1])
        assert (session.version, session.step_count) == (0, 0)

        table = comparison.table
        assert list(table.index) == list(variants)
        assert table["trial_kl"].notna().all() and (table["grad_norm"] > 0).all()
        tensors = batch.to_tensors()
        for name, result in comparison.variants.items():
            own = Actor(copy.deepcopy(actor.model), result.cfg).train_step(tensors, credit=batch.credit)
            assert table.loc[name, "loss"] == pytest.approx(own["loss"], abs=1e-6), name
        assert comparison.view().model.names == list(variants)

        session.train_step(batch)
        history = session.history
        for column in (
            "mismatch_logp_abs_diff",
            "mismatch_kl_k3",
            "mismatch_truncated_frac",
            "mismatch_masked_frac",
        ):
            assert column in history.columns and history[column].notna().all(), column
        assert "mismatch_kl_k3" in [s.column for s in history_series(history)]


def test_dapo_step_drops_constant_groups_and_counts_them():
    with Session(
        config(actor__algorithm="dapo", actor__dynamic_sampling_max_rounds=2, actor__use_decoupled_loss=False)
    ) as session:
        row = session.step()
        assert session.actor.cfg.eps_clip_higher == 0.28
        for key in ("dynamic_sampling_dropped_groups", "dynamic_sampling_rounds", "dynamic_sampling_groups"):
            assert key in row
        assert 0 <= row["dynamic_sampling_rounds"] <= 2
        assert row["dynamic_sampling_groups"] <= 2
        assert "dynamic_sampling_dropped_groups" in session.history.columns
