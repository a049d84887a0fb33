"""The two-agent example (a solver and a checker on the math task, configs/solver_checker.yaml)
trains in a Session on the embedded engine, the real proxy and the tiny model: both agents' calls
are recorded with their tag, the groups are (prompt, agent) pairs, the history logs each agent's
reward mean, two training steps move the version and the weights, and evaluation reports each
agent's reward."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.config import load_config
from areal_nb.train.algorithms import informative_groups

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "solver_checker.yaml"
SMALL = {
    "rollout.batch_size": 2,
    "rollout.group_size": 2,
    "rollout.max_new_tokens": 12,
    "logging.progress": False,
    "data.eval_size": 4,
    "logging.eval_every": 0,
}


def test_the_solver_and_the_checker_train_two_steps():
    config = load_config(CONFIG, [f"{k}={v}" for k, v in SMALL.items()])
    with Session(config) as session:
        before = {k: v.detach().clone() for k, v in session.actor.model.named_parameters()}
        informative = set()  # (step, group) pairs whose rows' rewards differ: they carry a gradient
        for step in (1, 2):
            batch = session.rollout()
            assert batch.accepted, [ep.rejection_reason for ep in batch.episodes]
            assert batch.agents == ["solver", "checker"]
            for i, ep in enumerate(batch.episodes):
                if ep.accepted:  # one solver and one checker call, each its own tree
                    calls = batch.calls(i)
                    assert [c.agent for c in calls] == ["solver", "checker"]
                    assert [c.parent for c in calls] == [None, None]
            t = batch.to_tensors().tensors()
            rows = batch.rows()
            assert t["agent_ids"].tolist() == [["solver", "checker"].index(r.agent) for r in rows]
            assert t["group_ids"].tolist() == [
                r.group_id * 2 + a for r, a in zip(rows, t["agent_ids"].tolist(), strict=True)
            ]
            means = batch.agent_reward_means()
            groups = informative_groups(t["rewards"], t["group_ids"].tolist())
            informative |= {(step, g) for g in groups}
            stats = session.train_step(batch, inspect=step == 2)
            assert stats["step"] == step and session.version == step
            if step == 2:  # the loss view's rows know their agents (in the tensors' row order)
                assert session.last_inspection.agents == [r.agent for r in rows]
            assert stats["reward_mean/solver"] == means["solver"]
            assert stats["reward_mean/checker"] == means["checker"]
            assert math.isfinite(stats["loss"])
        history = session.history
        assert list(history["step"]) == [1, 2]
        assert {"reward_mean/solver", "reward_mean/checker"} <= set(history.columns)
        changed = [
            k for k, v in session.actor.model.named_parameters() if not torch.equal(v.detach(), before[k])
        ]
        # a tiny batch's rewards may all tie within every (prompt, agent) group: no advantage, no step
        assert bool(changed) == bool(informative), (changed[:3], informative)
        # the dashboard plots each agent's reward beside the total
        from areal_nb.widgets.dashboard_model import history_series

        assert {"reward · solver", "reward · checker"} <= {s.label for s in history_series(history)}
        # evaluation reports each agent's mean return too, from its own greedy episodes
        result = session.evaluate()
        assert set(result.agent_rewards) == {"solver", "checker"}
        assert result.agent_rewards == result.batch.agent_reward_means()
        figures = result.as_dict()
        assert figures["eval_reward/solver"] == result.agent_rewards["solver"]
        assert figures["eval_reward/checker"] == result.agent_rewards["checker"]
