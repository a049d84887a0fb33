"""The Session end to end on the embedded engine, the real proxy and the tiny model.

Every test builds the Session it changes (tiny batches keep that cheap); the module-scoped
`eval_session` is only evaluated, never trained or rolled out, so test order does not matter.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.config import load_config

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "multi_turn_math.yaml"
SMALL = dict(rollout__batch_size=2, rollout__group_size=2, logging__progress=False, rollout__prefetch=False)


def config(**kw):
    overrides = {**SMALL, **kw}
    return load_config(CONFIG, [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()])


@pytest.fixture
def session():
    with Session(config()) as s:
        yield s


@pytest.fixture(scope="module")
def eval_session():
    """Read-only use: evaluate() only."""
    with Session(config(data__eval_size=40)) as s:
        yield s


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
    assert len(batch.episodes) == 4 and len(batch.groups) == 2
    assert batch.version == session.engine.get_version() == session.version
    from areal_nb.widgets import TreeView

    assert isinstance(batch.show_tree(0), TreeView)  # a Session's batches carry the widgets' viewer
    tensors = batch.to_tensors().tensors()
    # every generated token was sampled by the current policy version; prompt tokens are -1
    gen = tensors["loss_mask"].bool()
    assert (tensors["versions"][gen] == session.version).all()
    assert (tensors["versions"][~gen & tensors["attention_mask"]] == -1).all()
    # the agent leaves sampling to the proxy, which serves rollout.max_new_tokens (16) ...
    outputs = [c.model_response.output_len for i in range(4) for c in batch.calls(i)]
    assert max(outputs) <= session.config.rollout.max_new_tokens
    before = session.version
    stats = session.train_step(batch)
    # ... and rollout.temperature: the trainer's recomputed log-probs at it too
    # equal those the engine recorded, which holds only if the engine sampled at 1.0 too
    assert stats["logprob_abs_diff_max"] < 1e-4
    assert stats["importance_weight_max"] == pytest.approx(1.0, abs=1e-3)
    assert session.version == before + 1 == session.engine.get_version() == stats["version"]
    # the config's linear schedule decays over the run's total_steps
    assert session.actor.cfg.lr_decay_steps == session.config.total_steps
    assert stats["lr"] == session.actor.cfg.lr_at(session.actor.steps_done - 1) <= session.config.actor.lr
    assert len(session.history) == 1 and session.history["step"].tolist() == [1]
    # tokens sampled after the update carry the new version
    batch2 = session.rollout()
    t2 = batch2.to_tensors().tensors()
    assert (t2["versions"][t2["loss_mask"].bool()] == session.version).all()
    # a second turn (concat template) continues its first turn's sequence: the engine's prefix
    # cache serves that part, and the log-probs still equal the trainer's forward
    second_turns = sum(len(b.calls(i)) - 1 for b in (batch, batch2) for i in range(len(b.episodes)))
    assert session.engine.stats.prefix_cache_hits >= second_turns
    assert (session.engine.stats.prefix_cache_tokens > 0) == (session.engine.stats.prefix_cache_hits > 0)
    assert session.train_step(batch2)["logprob_abs_diff_max"] < 1e-4


def test_sampling_defaults_come_from_the_rollout_config():
    with Session(config(rollout__max_new_tokens=3)) as s:
        batch = s.rollout()
        outputs = [c.model_response.output_len for i in range(len(batch.episodes)) for c in batch.calls(i)]
    assert max(outputs) == 3  # 3-token budget: no "\boxed{..}" answer fits, so every call runs out


def test_reexport_changes_rewards_not_tokens(session):
    batch = session.rollout()
    a = batch.to_tensors().tensors()
    b = batch.reexport(discount=0.0, style="individual").to_tensors().tensors()
    assert b["input_ids"].shape[0] >= a["input_ids"].shape[0]
    df = batch.interactions_df
    assert set(df.columns) >= {
        "prompt_preview",
        "reply_preview",
        "reward",
        "reward_discounted",
        "input_tokens",
        "output_tokens",
        "version_min",
    }
    # with discount 0 every call keeps exactly the reward the agent set
    zero = batch.reexport(discount=0.0)
    for i, ep in enumerate(zero.episodes):
        if ep.accepted:
            raw = {
                c.interaction_id: (c.raw_reward if c.raw_reward is not None else c.reward or 0.0)
                for c in zero.calls(i)
            }
            assert zero.discounted(i) == pytest.approx(raw)


def test_step_callback_and_history(session):
    seen = []
    session.add_step_callback(seen.append)
    session.step()
    assert len(session.history) == 1 and seen[-1]["step"] == session.step_count == 1
    for key in (
        "loss",
        "reward_mean",
        "clip_frac",
        "approx_kl",
        "entropy",
        "staleness_mean",
        "rollout_tokens_per_s",
        "train_tokens_per_s",
    ):
        assert key in session.history.columns and not math.isnan(float(session.history[key].iloc[-1]))


def test_history_reward_mean_is_the_mean_episode_return(session):
    """The rollout's `reward_mean` (episode returns, as evaluate()'s) is the history's; the
    trainer's mean over its rows (one per call, discounted) is `row_reward_mean`."""
    batch = session.rollout()
    returns = [batch.episode_return(i) for i, ep in enumerate(batch.episodes) if ep.accepted]
    rows = batch.to_tensors().rewards
    row = session.train_step(batch)
    assert row["reward_mean"] == pytest.approx(sum(returns) / len(returns))
    assert row["row_reward_mean"] == pytest.approx(float(rows.float().mean()))
    last = session.history.iloc[-1]
    assert last["reward_mean"] == row["reward_mean"] and last["row_reward_mean"] == row["row_reward_mean"]


def test_keyboard_interrupt_during_rollout_leaves_session_usable(session):
    # Ctrl-C once episodes are running (not after a fixed delay: a fast machine could finish the
    # rollout first, and the signal would hit the test itself)
    def interrupt_once_running() -> None:
        for _ in range(3000):
            if session.executor.staleness.running > 0:
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_running)
    before = sys.getswitchinterval()
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        session.rollout(64)  # far more than one round of episodes
    interrupter.join()
    assert session.executor.staleness.running == 0 and session.executor.n_waiting == 0
    assert sys.getswitchinterval() == before  # the GIL setting of the rollout was given back
    batch = session.rollout(1)
    assert len(batch.episodes) == 2


class IntervalRecordingAgent:
    """Records the GIL switch interval it runs under; one real call through the proxy."""

    seen: list[float] = []

    async def run(self, data, *, base_url, api_key, http_client):
        from openai import AsyncOpenAI

        self.seen.append(sys.getswitchinterval())
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        await client.chat.completions.create(model="any", messages=data["messages"], max_completion_tokens=2)
        return 1.0


def test_gil_switch_interval_is_lowered_during_episodes_and_restored_after():
    before = sys.getswitchinterval()
    IntervalRecordingAgent.seen = []
    with (
        Session(
            config(rollout__gil_switch_interval=3e-4),
            agent__workflow=IntervalRecordingAgent,
            agent__workflow_kwargs={},
        ) as s,
        Session(
            config(rollout__gil_switch_interval="null"),
            agent__workflow=IntervalRecordingAgent,
            agent__workflow_kwargs={},
        ) as plain,
    ):
        s.train_step(s.rollout())
        assert sys.getswitchinterval() == before
        s.evaluate(n=2)
        assert sys.getswitchinterval() == before
        # [0] is the first-episode check (preflight.py), one episode alone: nothing to contend with
        assert (
            IntervalRecordingAgent.seen[1:] == [pytest.approx(3e-4)] * 6
        )  # 4 training + 2 evaluation episodes
        IntervalRecordingAgent.seen = []
        plain.rollout()
        assert IntervalRecordingAgent.seen[1:] == [before] * 4  # None: Python's own interval
    assert sys.getswitchinterval() == before


# ---------------------------------------------------------------------------------- evaluation


def test_evaluate_runs_the_agent_greedily_on_held_out(eval_session):
    from areal_nb.models import evaluate_accuracy

    s = eval_session
    state = (s.version, s.engine.get_version(), len(s.history), s.data.pos, s.executor.n_waiting)
    result = s.evaluate(n=40)
    assert (result.n, result.rejected, result.version) == (40, 0, 0)
    # first reply of the agent = a greedy reply to the problem, scored by math-verify
    assert result.accuracy == evaluate_accuracy(s.actor.model, s.tokenizer, s.eval_problems[:40])
    # the agent's loop can only solve more; its episode return is 1 when solved within its turns
    assert result.agent_accuracy >= result.accuracy
    assert result.reward_mean == pytest.approx(result.agent_accuracy)
    assert s.evaluate(n=40) == result  # greedy: deterministic
    # episodes of the agent's own loop: at most max_turns calls, a retry only after a wrong answer
    batch = result.batch
    for i in range(40):
        calls = batch.calls(i)
        assert 1 <= len(calls) <= 2 and (len(calls) == 1 or calls[0].raw_reward == 0.0)
    # nothing of training moved, nothing is left on the proxy
    assert (s.version, s.engine.get_version(), len(s.history), s.data.pos, s.executor.n_waiting) == state
    assert s.executor.staleness.running == 0 and s.proxy_caches() == {}


class ReplyLengthAgent:
    """A non-math task: answer the prompt once; the reward is `weight` per character of the reply.

    It asks for temperature 1.0 itself; evaluation must still decode greedily.
    """

    def __init__(self, weight: float) -> None:
        self.weight = weight

    async def run(self, data, *, base_url, api_key, http_client):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        completion = await client.chat.completions.create(
            model="any", messages=data["messages"], temperature=1.0, max_completion_tokens=8
        )
        return self.weight * len(completion.choices[0].message.content)


def test_evaluate_a_custom_task_is_the_mean_reward_of_greedy_episodes():
    from areal_nb.models.evaluation import generate_replies

    problems = [
        {"messages": [{"role": "user", "content": text}]}
        for text in ("What is 3 + 4?", "Tom has 12 apples and eats 5.", "hello", "Add 10 and 32.")
    ]
    with Session(config(), agent__workflow=ReplyLengthAgent, agent__workflow_kwargs={"weight": 0.25}) as s:
        result = s.evaluate(problems=problems)
        replies = generate_replies(
            s.actor.model, s.tokenizer, [p["messages"] for p in problems], max_new_tokens=8
        )
        expected = sum(0.25 * len(r) for r in replies) / len(problems)
        assert result.reward_mean == pytest.approx(expected, abs=1e-12) and expected > 0
        assert (
            s.evaluate(problems=problems).reward_mean == result.reward_mean
        )  # greedy despite temperature 1.0
        assert result.n == 4 and result.rejected == 0 and s.version == 0


def test_gsm8k_source_trains_and_evaluates_on_its_own_splits(tmp_path):
    from areal_nb.data import generate_problems

    def write(path, problems):
        path.write_text(
            "".join(json.dumps({"question": p["question"], "answer": p["answer"]}) + "\n" for p in problems)
        )

    train, test = generate_problems(30, seed=5), generate_problems(6, split="test")
    write(tmp_path / "gsm8k_train.jsonl", train)
    write(tmp_path / "gsm8k_test.jsonl", test)
    with Session(config(data__source=str(tmp_path / "gsm8k_train.jsonl"), data__eval_size=4)) as s:
        assert [p["question"] for p in s.eval_problems] == [p["question"] for p in test[:4]]
        batch = s.rollout()
        assert {ep.data["question"] for ep in batch.episodes} <= {p["question"] for p in train}
        result = s.evaluate()
        assert result.n == 4 and [ep.data["question"] for ep in result.batch.episodes] == [
            p["question"] for p in test[:4]
        ]


# ---------------------------------------------------------------------------------- debts


def test_kl_penalty_trains_against_a_frozen_reference_and_reports_kl():
    with Session(config(actor__kl_ctl=0.01)) as s:
        ref = s.actor.ref_model
        assert ref is not None and ref is not s.actor.model and not ref.training
        assert not any(p.requires_grad for p in ref.parameters())
        initial = {k: v.clone() for k, v in ref.state_dict().items()}
        s.run(1)
        # step 1 samples from the initial policy (= the reference)
        assert s.history["kl_ref"].tolist()[0] == pytest.approx(0.0, abs=1e-4)

        def moved():
            return any(not torch.equal(v, initial[k]) for k, v in s.actor.model.state_dict().items())

        # a step whose groups all have equal rewards leaves the policy where it was; step until it moves
        for _ in range(8):
            if moved():
                break
            s.run(1)
        assert moved()
        s.run(1)
        kl = s.history["kl_ref"].tolist()
        assert all(math.isfinite(v) for v in kl) and abs(kl[-1]) > 1e-6
        for k, v in ref.state_dict().items():
            torch.testing.assert_close(v, initial[k])


def test_batches_carry_the_configured_credit_and_train_with_theirs():
    with Session(config(actor__credit="turn")) as s:
        batch = s.rollout()
        assert batch.credit == "turn" and batch.reexport(credit="leaf").credit == "leaf"
        stats = s.train_step(batch)
        assert math.isfinite(stats["loss"]) and s.version == 1


def test_config_reaches_the_parts(tmp_path, monkeypatch):
    """agent.subproc_max_workers reaches the agent workflows; experiment_name names the run dir;
    logging.backend=tensorboard writes every step's scalars there."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    with Session(
        config(experiment_name="tb-run", agent__subproc_max_workers=3, logging__backend="tensorboard")
    ) as s:
        assert s.workflow.subproc_max_workers == 3 and s._lead.eval_workflow.subproc_max_workers == 3
        s.step()
        s.step()
        history = s.history
    events = EventAccumulator(str(tmp_path / "runs" / "tb-run" / "tensorboard"))
    events.Reload()
    for key in ("loss", "reward_mean", "grad_norm"):
        points = events.Scalars(key)
        assert [p.step for p in points] == [1, 2]
        assert [p.value for p in points] == pytest.approx(history[key].tolist(), rel=1e-6)


def test_wandb_backend_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # wandb reads it: no network, files under run_dir
    monkeypatch.setenv("WANDB_SILENT", "true")
    with Session(
        config(experiment_name="wb-run", logging__run_dir=str(tmp_path), logging__backend="wandb")
    ) as s:
        run = s._lead.metrics.run
        assert run.project == "wb-run" and run.offline
        s.step()
        s.step()  # wandb keeps a step's row open until the next step starts; step 1 is now sent
        loss = float(s.history["loss"].iloc[0])
        deadline = time.monotonic() + 60  # and its service applies rows asynchronously
        while run.summary.get("_step") != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run.summary["_step"] == 1 and run.summary["loss"] == pytest.approx(loss)
    assert len(list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))) == 1  # the run, ready for `wandb sync`


# ---------------------------------------------------------------------------------- lifecycle


# tqdm's progress-bar monitor starts with the first bar transformers draws and lives as long as
# the process: a library's daemon, not the Session's.
LIBRARY_THREADS = {"tqdm_monitor"}


def test_close_and_recreate_leaks_no_threads_or_ports():
    baseline = {t.name for t in threading.enumerate()} | LIBRARY_THREADS
    for _ in range(2):
        s = Session(config())
        url = s.proxy_url
        s.rollout(1)
        s.evaluate(n=2)
        s.close()
        s.close()  # idempotent
        assert port_is_free(url)
    time.sleep(0.5)
    leftover = [t.name for t in threading.enumerate() if t.name not in baseline and t.is_alive()]
    assert leftover == []
    with pytest.raises(RuntimeError, match="closed"):
        s.rollout(1)


def test_failed_start_leaves_no_threads():
    baseline = {t.name for t in threading.enumerate()} | LIBRARY_THREADS
    with pytest.raises(ValueError, match="no_such_module"):
        Session(config(), agent__workflow="no_such_module.Agent")
    time.sleep(0.5)
    assert [t.name for t in threading.enumerate() if t.name not in baseline and t.is_alive()] == []


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
        Session(CONFIG, rollout__batch_sise=3)
    with pytest.raises(ConfigError, match="Cannot export interactions in 'concat' style"):
        Session(None, agent__chat_template_type="hf", agent__export_style="concat")


def test_direct_arealopenai_workflow_is_trainable_too():
    """The legacy path: a RolloutWorkflow on ArealOpenAI, resolved from an import string,
    constructed with exactly its workflow_kwargs."""
    kwargs = {"tokenizer": "tiny-math", "max_turns": 2, "max_new_tokens": 16, "export_style": "individual"}
    with Session(
        config(),
        agent__workflow="areal_nb.agents.direct_math.MultiTurnMathWorkflow",
        agent__workflow_kwargs=kwargs,
    ) as s:
        batch = s.rollout()
        assert all(ep.accepted for ep in batch.episodes), [ep.rejection_reason for ep in batch.episodes]
        tensors = batch.to_tensors().tensors()
        # concat rows: one per leaf, every generated token sampled by version 0
        assert tensors["input_ids"].shape[0] == len(batch.episodes)
        assert (tensors["versions"][tensors["loss_mask"].bool()] == 0).all()
        stats = s.train_step(batch)
        assert stats["logprob_abs_diff_max"] < 1e-4 and s.engine.get_version() == 1
        # evaluation runs the same workflow on a greedy view of the engine
        result = s.evaluate(n=8)
        assert result.n == 8 and result.rejected == 0 and s.evaluate(n=8) == result


def test_the_engine_serves_the_policys_parameters_and_its_record_replaces_the_recomputation():
    """float32 on the CPU (the default): one copy of the weights, each push a version change; with
    two minibatches (where π_prox would be a separate forward) the engine's record is π_prox
    while every token is of the current version, and a stale batch is recomputed."""
    with Session(config(actor__ppo_n_minibatches=2)) as s:
        engine, policy = s.engine, s.actor.model
        assert engine.shares_weights and s.actor.in_place_engine is engine
        served = dict(engine.model.named_parameters())
        assert all(served[name] is p for name, p in policy.named_parameters())
        fresh, stale = s.rollout(), s.rollout()  # both sampled at version 0
        stats = s.train_step(fresh)
        assert stats["prox_from_engine"] == 1.0 and "logprob_abs_diff_max" not in stats
        assert s.engine.get_version() == s.version == 1 and not engine.paused
        stats = s.train_step(stale)  # sampled one version ago: recomputed, and compared
        assert stats["prox_from_engine"] == 0.0 and stats["staleness_max"] == 1.0
        assert stats["logprob_abs_diff_max"] > 0
        # the engine serves the updated parameters: the record of a new batch is the trainer's again
        stats = s.train_step(s.rollout(), inspect=True)
        assert stats["prox_from_engine"] == 1.0
    with Session(config(actor__ppo_n_minibatches=2, actor__skip_redundant_recompute=False)) as s:
        stats = s.train_step(s.rollout())  # the knob forces the recomputation, and the drift check
        assert stats["prox_from_engine"] == 0.0 and stats["logprob_abs_diff_max"] < 1e-4


def test_a_bfloat16_engine_keeps_its_own_copy_and_the_trainer_recomputes():
    with Session(config(model__dtype="bfloat16", actor__ppo_n_minibatches=2)) as s:
        assert not s.engine.shares_weights and s.actor.in_place_engine is None
        policy = dict(s.actor.model.named_parameters())
        assert all(p is not policy[n] for n, p in s.engine.model.named_parameters())
        stats = s.train_step(s.rollout())
        assert stats["prox_from_engine"] == 0.0 and "logprob_abs_diff_max" in stats
        assert s.engine.get_version() == 1
