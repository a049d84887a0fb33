"""`agents: {name: {lora: ...}}`: the solver and the checker train one adapter each on one base,
in a Session on the embedded engines, the real proxy and the tiny model. Each call is served by
its own agent's policy (the engine's log-probs equal the trainer's under that agent's adapter),
each engine holds its agent's merged weights, and checkpoints, resume and export keep every
agent's adapter apart. The proxy routes each call by its `model` and refuses other agents (400)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.api import GenerationConfig, ModelRequest
from areal_nb.config import ConfigError, load_config
from areal_nb.engine.agent_engines import AgentEngines
from areal_nb.errors import UnknownAgentError
from areal_nb.train.lora import adapter_name

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "solver_checker.yaml"
AGENTS = ["solver", "checker"]
OVERRIDES = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=12",
    "logging.progress=false",
    "data.eval_size=4",
    "logging.eval_every=0",
    "agents.solver.lora.r=4",
    "agents.checker.lora.r=2",
    "actor.lr=1e-2",
]
KEY = "model.layers.0.self_attn.q_proj.weight"


def _scramble_adapters(session: Session, seed: int) -> None:
    """Distinct, clearly non-zero adapters for both agents, pushed to their engines."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in session.actor.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
    session.actor.push_weights(session.engine, session.version)


def _check_each_call_is_served_by_its_own_agents_adapter(session: Session) -> None:
    """After a step and distinct adapters pushed, a batch's recorded log-probs are the trainer's
    under each call's own agent's adapter (and the two policies differ clearly on those rows)."""
    session.train_step(session.rollout())
    _scramble_adapters(session, seed=1)
    batch = session.rollout()
    assert batch.accepted and batch.agents == AGENTS
    # the two policies differ clearly on these rows, so a call served by the other agent's
    # adapter would show in the recorded log-probs
    tensors = batch.to_tensors().tensors()
    mask = tensors["loss_mask"].bool()
    per_agent = {}
    for agent in AGENTS:
        session.actor.model.set_adapter(adapter_name(agent))
        with torch.no_grad():
            logits = session.actor.model(input_ids=tensors["input_ids"]).logits.log_softmax(-1)
        per_agent[agent] = logits[:, :-1].gather(-1, tensors["input_ids"][:, 1:, None]).squeeze(-1)
    assert float((per_agent["solver"] - per_agent["checker"]).abs()[mask[:, 1:]].max()) > 0.05
    stats = session.train_step(batch)
    assert stats["logprob_abs_diff_max"] < 1e-4, stats["logprob_abs_diff_max"]
    assert session.version == 2 and {"reward_mean/solver", "reward_mean/checker"} <= set(stats)
    with pytest.raises(UnknownAgentError, match="'solver', 'checker'"):
        asyncio.run(
            session.engine.agenerate(ModelRequest([3, 4, 5], GenerationConfig(max_new_tokens=2), agent="x"))
        )


@pytest.mark.slow
def test_each_agent_trains_and_is_served_by_its_own_adapter(tmp_path):
    config = load_config(CONFIG, [*OVERRIDES, f"logging.run_dir={tmp_path / 'run'}"])
    with Session(config) as session:
        assert isinstance(session.engine, AgentEngines) and session.engine.agents == AGENTS
        _check_each_call_is_served_by_its_own_agents_adapter(session)
        # each engine serves its own agent's base + ΔW, at the new version
        for agent in AGENTS:
            engine = session.engine.engines[agent]
            assert engine.get_version() == 2
            torch.testing.assert_close(
                engine.model.state_dict()[KEY], session.actor.policy_weights(agent)[KEY]
            )
        assert not torch.equal(
            session.engine.engines["solver"].model.state_dict()[KEY],
            session.engine.engines["checker"].model.state_dict()[KEY],
        )
        # greedy evaluation goes to each agent's own engine too, and reports each agent
        result = session.evaluate()
        assert result.rejected == 0 and set(result.agent_rewards) == set(AGENTS)
        saved = {agent: session.actor.policy_weights(agent) for agent in AGENTS}
        session.save(tmp_path / "checkpoint")
        session.save_pretrained(tmp_path / "solver", agent="solver")
        session.save_pretrained(tmp_path / "checker-adapter", agent="checker", merged=False)
        with pytest.raises(ValueError, match="name the agent to export"):
            session.save_pretrained(tmp_path / "nobody")

    # resume: both adapters, and both engines serving them
    with Session.load(tmp_path / "checkpoint") as resumed:
        for agent in AGENTS:
            weights = resumed.actor.policy_weights(agent)
            assert all(torch.equal(weights[k], saved[agent][k]) for k in saved[agent])
            torch.testing.assert_close(resumed.engine.engines[agent].model.state_dict()[KEY], weights[KEY])
        resumed.train_step(resumed.rollout())
        assert resumed.version == 3

    # the exported policies load with plain transformers / peft and are the agents' own
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from areal_nb.models import load_model
    from areal_nb.session.hf_export import export_checkpoint

    solver = AutoModelForCausalLM.from_pretrained(tmp_path / "solver")
    torch.testing.assert_close(solver.state_dict()[KEY], saved["solver"][KEY])
    exported = export_checkpoint(tmp_path / "checkpoint", tmp_path / "exported-checker", agent="checker")
    checker = AutoModelForCausalLM.from_pretrained(exported)
    torch.testing.assert_close(checker.state_dict()[KEY], saved["checker"][KEY])
    with_adapter = PeftModel.from_pretrained(
        load_model("tiny-math", dtype=torch.float32), tmp_path / "checker-adapter"
    )
    ids = torch.arange(3, 20).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(
            with_adapter(input_ids=ids).logits, checker(input_ids=ids).logits, rtol=1e-4, atol=1e-4
        )


@pytest.mark.slow
@pytest.mark.server
def test_agent_adapters_on_launched_engine_servers(tmp_path):
    """The same on the launch path (`engine.type: sglang`, the command swapped for `areal-nb
    engine-server`): the server starts with room for every agent's adapter, each push loads
    every agent's adapter, and each call names its agent's."""
    config = load_config(
        CONFIG,
        [
            *OVERRIDES,
            f"logging.run_dir={tmp_path / 'run'}",
            "engine.type=sglang",
            "engine.launch.command=engine-server",
            "engine.launch.n_servers=1",
        ],
    )
    with Session(config) as session:
        (proc,) = session.engine.owned_processes
        flags = proc.command[proc.command.index("--enable-lora") :]
        assert flags[:7] == [
            "--enable-lora",
            "--max-lora-rank",
            "4",
            "--lora-target-modules",
            "all",
            "--max-loras-per-batch",
            "4",
        ]
        _check_each_call_is_served_by_its_own_agents_adapter(session)
        folders = sorted(
            p.name for p in (tmp_path / "run" / "weights").iterdir() if not p.name.startswith(".")
        )
        # each agent's adapters only (the last two versions of each), never a model
        assert folders == sorted(f"adapter-{a}-{v}" for a in AGENTS for v in (1, 2)), folders


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["agents.a.lora.r=4", "actor.lora.r=4"], "set one or the other"),
        (["agents.a.lora.r=0"], "lora.r must be >= 1"),
        (["agents.a.lora=null"], "agents.a.lora"),
    ],
)
def test_agents_configs_that_cannot_train_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG, overrides)
