"""The Session end to end on the embedded engine, the real proxy and the tiny model."""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time

import pytest
import torch

from areal_nb import Session
from areal_nb.config import load_config

pytestmark = pytest.mark.slow

SMALL = dict(rollout__batch_size=2, rollout__group_size=2, logging__progress=False, rollout__prefetch=False)


def config(**kw):
    overrides = {**SMALL, **kw}
    return load_config("configs/multi_turn_math.yaml",
                       [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="module")
def session():
    s = Session(config())
    yield s
    s.close()


def port_is_free(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        try:
            sock.bind((host, int(port)))
        except OSError:
            return False
    return True


def test_rollout_train_and_versions(session):
    batch = session.rollout()
    assert len(batch.episodes) == 4 and {ep.group_id for ep in batch.episodes} == {ep.group_id for ep in batch.episodes[:1]} | {batch.episodes[-1].group_id}
    assert batch.version == session.engine.get_version() == session.version
    tensors = batch.to_tensors()
    # every generated token was sampled by the current policy version; prompt tokens are -1
    gen = tensors["loss_mask"].bool()
    assert (tensors["versions"][gen] == session.version).all()
    assert (tensors["versions"][~gen & tensors["attention_mask"]] == -1).all()
    before = session.version
    stats = session.train_step(batch)
    # on-policy: the trainer's recomputed log-probs equal those the engine recorded
    assert stats["logprob_abs_diff_max"] < 1e-4
    assert stats["importance_weight_max"] == pytest.approx(1.0, abs=1e-3)
    assert session.version == before + 1 == session.engine.get_version() == stats["version"]
    # the config's linear schedule decays over the run's total_steps
    assert session.actor.cfg.lr_decay_steps == session.config.total_steps
    assert stats["lr"] == session.actor.cfg.lr_at(session.actor.steps_done - 1) <= session.config.actor.lr
    assert len(session.history) == 1 and session.history["step"].tolist() == [1]
    # tokens sampled after the update carry the new version
    batch2 = session.rollout()
    t2 = batch2.to_tensors()
    assert (t2["versions"][t2["loss_mask"].bool()] == session.version).all()


def test_reexport_changes_rewards_not_tokens(session):
    batch = session.rollout()
    a = batch.to_tensors()
    b = batch.reexport(discount=0.0, style="individual").to_tensors()
    assert b["input_ids"].shape[0] >= a["input_ids"].shape[0]
    df = batch.interactions_df
    assert set(df.columns) >= {"prompt_preview", "reply_preview", "reward", "reward_discounted", "input_tokens",
                               "output_tokens", "version_min"}
    # with discount 0 every call keeps exactly the reward the agent set
    zero = batch.reexport(discount=0.0)
    for i, ep in enumerate(zero.episodes):
        if ep.accepted:
            raw = {c.interaction_id: (c.raw_reward if c.raw_reward is not None else c.reward or 0.0)
                   for c in zero.calls(i)}
            assert zero.discounted(i) == pytest.approx(raw)


def test_step_callback_and_history(session):
    seen = []
    session.add_step_callback(seen.append)
    n = len(session.history)
    session.step()
    assert len(session.history) == n + 1 and seen[-1]["step"] == session.step_count
    for key in ("loss", "reward_mean", "clip_frac", "approx_kl", "entropy", "staleness_mean",
                "rollout_tokens_per_s", "train_tokens_per_s"):
        assert key in session.history.columns and not math.isnan(float(session.history[key].iloc[-1]))


def test_keyboard_interrupt_during_rollout_leaves_session_usable(session):
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        session.rollout(64)  # far more than fits in half a second
    timer.join()
    assert session.executor.staleness.running == 0 and session.executor.n_waiting == 0
    batch = session.rollout(1)
    assert len(batch.episodes) == 2


def test_evaluate_is_greedy_accuracy_on_held_out(session):
    from areal_nb.models import evaluate_accuracy

    acc = session.evaluate(n=40)
    assert acc == evaluate_accuracy(session.actor.model, session.tokenizer, session.eval_problems[:40])
    assert session.evaluate(n=40) == acc  # greedy: deterministic
    # the agent's loop can only solve more: turn 1 is the same greedy reply
    assert session.evaluate(n=40, turns=2) >= acc
    with pytest.raises(ValueError, match="turns"):
        session.evaluate(turns=0)


def test_close_and_recreate_leaks_no_threads_or_ports():
    baseline = {t.name for t in threading.enumerate()}
    for _ in range(2):
        s = Session(config())
        url = s.proxy_url
        s.rollout(1)
        s.close()
        s.close()  # idempotent
        assert port_is_free(url)
    time.sleep(0.5)
    leftover = [t.name for t in threading.enumerate() if t.name not in baseline and t.is_alive()]
    assert leftover == []
    with pytest.raises(RuntimeError, match="closed"):
        s.rollout(1)


@pytest.mark.parametrize("max_off", [0, 2])
def test_staleness_bound_holds_with_async_rollouts(max_off):
    with Session(config(rollout__max_head_offpolicyness=max_off, rollout__prefetch=True)) as s:
        s.run(3)
        stale = s.history["staleness_max"].tolist()
    assert all(v <= max_off for v in stale), stale


def test_save_load_continue_gives_same_stats(tmp_path):
    with Session(config(seed=3)) as a:
        a.step()
        ckpt = a.save(tmp_path / "ckpt")
        batch = a.rollout()
        pos = a.data.pos
        stats_a = a.train_step(batch)
        weights_a = {k: v.clone() for k, v in a.actor.model.state_dict().items()}
    with Session.load(ckpt) as b:
        assert (b.step_count, b.version, b.engine.get_version()) == (1, 1, 1)
        assert len(b.history) == 1
        assert b.data.pos == pos - len(batch.groups)  # where `a` was when it saved
        stats_b = b.train_step(batch)
        for key in ("loss", "adv_mean", "adv_std", "clip_frac", "approx_kl", "entropy", "grad_norm"):
            assert stats_b[key] == pytest.approx(stats_a[key], rel=1e-5, abs=1e-6), key
        for k, v in b.actor.model.state_dict().items():
            torch.testing.assert_close(v, weights_a[k])


def test_bad_config_is_a_clear_error():
    from areal_nb.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.batch_sise.*did you mean"):
        Session("configs/multi_turn_math.yaml", rollout__batch_sise=3)
    with pytest.raises(ConfigError, match="export_style='concat' needs"):
        Session(None, agent__chat_template_type="hf", agent__export_style="concat")


def test_direct_arealopenai_workflow_is_trainable_too():
    """The seed's legacy path: a RolloutWorkflow on ArealOpenAI, resolved from an import string."""
    cfg = config(**{"agent__workflow": "areal_nb.agents.direct_math.MultiTurnMathWorkflow"})
    with Session(cfg) as s:
        batch = s.rollout()
        assert all(ep.accepted for ep in batch.episodes), [ep.rejection_reason for ep in batch.episodes]
        tensors = batch.to_tensors()
        # concat rows: one per leaf, every generated token sampled by version 0
        assert tensors["input_ids"].shape[0] == len(batch.episodes)
        assert (tensors["versions"][tensors["loss_mask"].bool()] == 0).all()
        stats = s.train_step(batch)
        assert stats["logprob_abs_diff_max"] < 1e-4 and s.engine.get_version() == 1
