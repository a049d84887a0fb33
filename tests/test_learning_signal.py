"""Whether a step can teach anything: the history's zero_signal_groups / truncated_share /
reply_len_mean on batches built by hand, the advice, and the Session's warning (said once per
stretch of such steps)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest

from areal_nb.errors import NoLearningSignalWarning
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import Episode
from areal_nb.rollout.learning_signal import no_signal_advice, progress_note, signal_stats
from areal_nb.session.diagnostics import SignalWatch
from tests.rollout.test_batch_tensors import episode


def batch_of(*groups: list[list[float]], truncated: tuple[str, ...] = ()) -> RolloutBatch:
    """One group per argument, one episode per list of per-turn rewards; the calls named in
    `truncated` stopped at the token budget."""
    episodes = [
        episode(f"g{g}-{s}", rewards, g, s, "hf")
        for g, group in enumerate(groups)
        for s, rewards in enumerate(group)
    ]
    for ep in episodes:
        for iid, call in ep.interactions.items():
            if iid in truncated:
                call.model_response.stop_reason = "length"
    return RolloutBatch(episodes)


def test_two_groups_of_equal_returns_and_one_that_differs_carry_a_third_of_the_signal():
    # group 2's first episode answers right on its second turn (return 1 against 0); its replies are
    # 2 and 3 tokens long, every other episode's one reply 2 (sample 0) or 3 (sample 1) tokens
    batch = batch_of([[1.0], [1.0]], [[0.0], [0.0]], [[0.0, 1.0], [0.0]], truncated=("g0-1-0", "g2-0-1"))
    batch.episodes[2].interactions["g1-0-0"].model_response.stop_reason = "abort"  # stopped, not cut
    stats = signal_stats(batch)
    assert stats["zero_signal_groups"] == pytest.approx(2 / 3)
    assert stats["truncated_share"] == pytest.approx(2 / 7)  # replies are calls: 7 of them
    assert stats["reply_len_mean"] == pytest.approx((2 + 3) * 3 / 7 + 3 / 7)


def test_rejected_episodes_do_not_count_and_an_empty_batch_measures_nothing():
    batch = batch_of([[1.0], [0.0]], truncated=("g0-1-0",))
    rejected = dataclasses.replace(batch.episodes[1], rejection_reason="agent_error: boom")
    one_left = RolloutBatch([batch.episodes[0], rejected])
    # one accepted episode: its group cannot differ from itself (GRPO's advantage is 0)
    assert signal_stats(one_left) == {
        "zero_signal_groups": 1.0,
        "truncated_share": 0.0,
        "reply_len_mean": 2.0,
    }
    nothing = signal_stats(RolloutBatch([Episode(data={}, group_id=0, sample_id=0, version_submitted=0)]))
    assert all(math.isnan(v) for v in nothing.values())


def test_a_group_is_a_prompt_and_an_agent():
    batch = batch_of([[1.0], [0.0]])
    solver = next(iter(batch.episodes[0].interactions.values()))
    # the same prompt's second agent: one call in each episode, both scored 1
    for s, ep in enumerate(batch.episodes):
        checker = dataclasses.replace(solver, _interaction_id=f"checker-{s}", parent=None, reward=1.0)
        checker.agent = "checker"
        ep.interactions[checker.interaction_id] = checker
    assert signal_stats(batch)["zero_signal_groups"] == 0.5  # the checker's group has no signal


def test_advice_names_what_to_try_and_asks_for_tokens_only_when_replies_are_cut():
    quiet = {"zero_signal_groups": 0.75, "truncated_share": 0.1, "reply_len_mean": 9.0}
    advice = no_signal_advice(quiet)
    assert advice is not None and advice.startswith("75% of the groups had equal rewards")
    assert "rollout.group_size" in advice and "actor.dynamic_sampling=True" in advice
    assert "max_new_tokens" not in advice
    cut = no_signal_advice({**quiet, "truncated_share": 0.8})
    assert cut is not None and "80% of the replies were cut" in cut and "rollout.max_new_tokens" in cut
    assert no_signal_advice({**quiet, "zero_signal_groups": 0.5}) is None  # half is not most
    assert no_signal_advice({"zero_signal_groups": math.nan}) is None and no_signal_advice({}) is None
    assert set(progress_note({**quiet, "truncated_share": 0.8})) == {"no_signal", "truncated"}
    assert progress_note({**quiet, "zero_signal_groups": 0.25}) == {}


def _warnings_from(watch: SignalWatch, shares: list[float]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, share in enumerate(shares, 1):
            watch.observe({"step": step, "zero_signal_groups": share, "truncated_share": 0.0})
    assert all(issubclass(w.category, NoLearningSignalWarning) for w in caught)
    return [str(w.message) for w in caught]


def test_the_watch_warns_once_per_stretch_of_steps_without_signal():
    said = _warnings_from(SignalWatch(), [1.0, 1.0, 0.9, 0.0, math.nan, 1.0, 1.0, 0.2, 0.4])
    assert [m.split(":")[0] for m in said] == ["step 1", "step 6"]  # again only after it went away
    assert said[0].startswith("step 1: 100% of the groups had equal rewards")
    assert _warnings_from(SignalWatch(), [0.0, 0.5, 0.3, math.nan]) == []  # mixed batches: nothing


@pytest.mark.slow
def test_a_session_step_on_equal_rewards_warns_and_a_mixed_one_does_not():
    from areal_nb import Session
    from tests.faults.conftest import small_config

    equal = batch_of([[1.0], [1.0]], [[0.0], [0.0]])
    mixed = batch_of([[1.0], [0.0]], [[0.0], [0.0]])
    with Session(small_config()) as session:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            row = session.train_step(equal)
            assert row["zero_signal_groups"] == 1.0 and row["grad_norm"] == 0.0
            session.train_step(equal)  # the same stretch: said once
            quiet = [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]
            assert [str(w.message)[:7] for w in quiet] == ["step 1:"]
            caught.clear()
            row = session.train_step(mixed)
            assert row["zero_signal_groups"] == 0.5 and row["grad_norm"] > 0.0
            assert not [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]
        history = session.history
        assert list(history["zero_signal_groups"]) == [1.0, 1.0, 0.5]
        assert list(history["reply_len_mean"]) == [2.5, 2.5, 2.5]
        assert list(history["truncated_share"]) == [0.0, 0.0, 0.0]
