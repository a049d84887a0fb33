"""Closing a Session stops every process it started, the agent's reward workers included.

(Its own module: a module-scoped Session elsewhere would share the reward worker pool, which is
ref-counted across agents and only stops when the last one closes.)
"""

from __future__ import annotations

import gc
import multiprocessing
from pathlib import Path

import pytest

from areal_nb import Session
from areal_nb.agents.math_agent import MultiTurnMathAgent
from areal_nb.config import load_config

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"


def test_close_stops_the_math_agents_reward_workers():
    gc.collect()  # agents of earlier tests release their share of the pool
    before = {p.pid for p in multiprocessing.active_children()}
    agent = MultiTurnMathAgent()
    cfg = load_config(
        CONFIG,
        ["rollout.batch_size=2", "rollout.group_size=2", "logging.progress=false", "rollout.prefetch=false"],
    )
    s = Session(cfg, agent__workflow=agent)
    s.rollout(1)
    workers = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert workers, "the math agent scored its answers without reward worker processes"
    s.close()
    for p in workers:
        p.join(timeout=10)
    assert [p.pid for p in workers if p.is_alive()] == []
    assert agent._reward is None
