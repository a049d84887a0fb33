"""One LoRA adapter per agent on one frozen base (`Actor(agent_lora=...)`): each adapter trains on
its own agent's rows only, every forward runs one agent's adapter, the base and the KL reference
stay the base, and a batch with rows of an agent that has no adapter is refused untouched."""

from __future__ import annotations

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.models import load_model
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.actor_policies import reference_logprobs
from areal_nb.train.lora import LoraConfig, adapter_name, lora_base, merged_weights
from areal_nb.train.step_batch import prepare_step, row_agents

AGENTS = ["solver", "checker.v2"]  # a dot: adapter names replace it (peft keys split on dots)


def _actor(**cfg) -> Actor:
    torch.manual_seed(0)
    model = load_model("tiny-math", dtype=torch.float32, device="cpu")
    config = GRPOConfig(lr=1e-2, micro_batch_size=2, **cfg)
    return Actor(model, config, agent_lora={a: LoraConfig(r=4, alpha=8) for a in AGENTS})


def _batch(agent_of_row: list[int], rewards: list[float], length: int = 10) -> dict[str, torch.Tensor]:
    """Rows with no token in common (each token tells its row), the last half generated."""
    rows = len(agent_of_row)
    input_ids = torch.stack([torch.arange(length) + 3 + length * r for r in range(rows)])
    loss_mask = torch.zeros(rows, length, dtype=torch.long)
    loss_mask[:, length // 2 :] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(rows, length, dtype=torch.bool),
        "loss_mask": loss_mask,
        "logprobs": torch.full((rows, length), -2.0) * loss_mask,
        "rewards": torch.tensor(rewards),
        "agent_ids": torch.tensor(agent_of_row),
        # one prompt; (prompt, agent) groups as RolloutBatch.to_tensors makes them
        "group_ids": torch.tensor(agent_of_row),
    }


def _adapter_params(actor: Actor, agent: str) -> dict[str, torch.Tensor]:
    name = adapter_name(agent)
    return {n: p.detach().clone() for n, p in actor.model.named_parameters() if name in n.split(".")}


def test_each_adapter_learns_from_its_own_agents_rows_only():
    actor = _actor()
    base_before = {k: v.clone() for k, v in lora_base(actor.model).state_dict().items() if "lora_" not in k}
    solver_before, checker_before = (_adapter_params(actor, a) for a in AGENTS)
    assert solver_before and checker_before and solver_before.keys().isdisjoint(checker_before)
    # the solver's rows differ in reward (a gradient); the checker's tie (advantage 0 everywhere)
    batch = _batch([0, 0, 1, 1, 0, 1], [1.0, 0.0, 0.5, 0.5, 1.0, 0.5])

    forwards: list[tuple[str, set[int]]] = []  # (active adapter, the tokens embedded)
    embed = lora_base(actor.model).get_input_embeddings()  # (the packed forward walks the layers)
    hook = embed.register_forward_pre_hook(
        lambda module, args: forwards.append((actor.model.active_adapter, set(args[0].flatten().tolist())))
    )
    try:
        stats = actor.train_step(TrainBatch(**batch), agents=AGENTS)
    finally:
        hook.remove()

    assert stats["grad_norm"] > 0
    solver_after, checker_after = (_adapter_params(actor, a) for a in AGENTS)
    assert any(not torch.equal(solver_after[k], solver_before[k]) for k in solver_before)
    assert all(torch.equal(checker_after[k], checker_before[k]) for k in checker_before)
    base_after = lora_base(actor.model).state_dict()
    assert all(torch.equal(base_after[k], v) for k, v in base_before.items())
    # every forward ran one agent's rows under that agent's adapter
    agents = [0, 0, 1, 1, 0, 1]
    agent_of_token = {int(t): AGENTS[agents[r]] for r in range(len(agents)) for t in batch["input_ids"][r]}
    assert len(forwards) >= 2
    for active, tokens in forwards:
        assert {adapter_name(agent_of_token[t]) for t in tokens if t in agent_of_token} == {active}


def test_each_agents_policy_is_the_base_with_its_own_adapter_merged():
    actor = _actor()
    for agent in AGENTS:  # distinct, non-zero adapters (B starts at zero)
        for n, p in actor.model.named_parameters():
            if adapter_name(agent) in n.split(".") and "lora_B" in n:
                torch.nn.init.normal_(p, std=0.05)
    key = "model.layers.0.self_attn.q_proj.weight"
    solver, checker = (actor.policy_weights(a) for a in AGENTS)
    assert not torch.equal(solver[key], checker[key])
    actor.model.set_adapter(adapter_name(AGENTS[1]))
    assert torch.equal(merged_weights(actor.model)[key], checker[key])
    # the forward under an agent's adapter is the plain model with that agent's merged weights
    ids = torch.arange(3, 15).unsqueeze(0)
    plain = load_model("tiny-math", dtype=torch.float32, device="cpu")
    plain.load_state_dict(checker)
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
        got = lora_base(actor.model)(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="name one of"):
        actor.policy_weights("stranger")


def test_the_kl_reference_is_the_base_with_every_adapter_off():
    actor = _actor(kl_ctl=0.1)
    for n, p in actor.model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    batch = TrainBatch(**_batch([0, 1, 0, 1], [1.0, 0.0, 0.0, 1.0]))
    step = prepare_step(actor, batch)
    step.row_agents = row_agents(actor, batch, AGENTS)
    reference = reference_logprobs(actor, step)
    plain = load_model("tiny-math", dtype=torch.float32, device="cpu")
    with torch.no_grad():
        logits = plain(input_ids=batch.input_ids).logits.float().log_softmax(-1)
    expected = logits[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(
        reference[:, 1:][step.mask[:, 1:]], expected[step.mask[:, 1:]], rtol=1e-5, atol=1e-5
    )
    stats = actor.train_step(batch, agents=AGENTS)
    assert stats["kl_ref"] > 0  # the adapters moved the policy away from the base


def test_rows_of_an_agent_without_an_adapter_are_refused_and_nothing_changes():
    actor = _actor()
    before = {n: p.detach().clone() for n, p in actor.model.named_parameters()}
    batch = _batch([0, 1, 2, 2], [1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"'stranger'.*which have no adapter"):
        actor.train_step(TrainBatch(**batch), agents=[*AGENTS, "stranger"])
    with pytest.raises(ValueError, match="agents="):
        actor.train_step(TrainBatch(**_batch([0, 1], [1.0, 0.0])))
    assert actor.version == 0
    assert all(torch.equal(p, before[n]) for n, p in actor.model.named_parameters())


def test_agent_adapters_refuse_a_second_lora_config_and_a_reference_model():
    model = load_model("tiny-math", dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="unset actor.lora"):
        Actor(model, GRPOConfig(lora=LoraConfig()), agent_lora={"a": LoraConfig()})
    with pytest.raises(ValueError, match="ref_model"):
        Actor(model, GRPOConfig(kl_ctl=0.1), ref_model=model, agent_lora={"a": LoraConfig()})
