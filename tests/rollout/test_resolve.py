"""resolve_workflow and GroupedRolloutWorkflow (with per-member exceptions)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from areal_nb.api import RolloutWorkflow
from areal_nb.rollout import (
    GroupedRolloutWorkflow,
    GroupedTensors,
    GroupedTrajectory,
    import_from_string,
    requires_proxy,
    resolve_workflow,
)
from areal_nb.rollout.workflow import OpenAIProxyWorkflow
from tests.proxy import agents

PROXY = {"proxy_addr": "http://127.0.0.1:1", "admin_api_key": "admin"}


def test_instance_is_used_and_kwargs_ignored_with_warning(caplog):
    wf = agents.ConstWorkflow(3)
    with caplog.at_level(logging.WARNING):
        assert resolve_workflow(wf, {"value": 9}) is wf
    assert "ignored" in caplog.text


def test_class_needs_kwargs_and_is_instantiated():
    with pytest.raises(ValueError, match="workflow_kwargs is required"):
        resolve_workflow(agents.ConstWorkflow)
    wf = resolve_workflow(agents.ConstWorkflow, {"value": 5})
    assert isinstance(wf, agents.ConstWorkflow) and wf.value == 5


def test_import_strings_dot_and_colon():
    wf = resolve_workflow("tests.proxy.agents.ConstWorkflow", {"value": 4})
    assert type(wf).__name__ == "ConstWorkflow" and wf.value == 4
    assert resolve_workflow("tests.proxy.agents:CONST_WORKFLOW").value == 7
    agent_wf = resolve_workflow("tests.proxy.agents.ChatAgent", {"turns": 3}, **PROXY, mode="inline")
    assert isinstance(agent_wf, OpenAIProxyWorkflow)
    assert agent_wf.agent.turns == 3 and agent_wf.proxy_addr == "http://127.0.0.1:1"


def test_import_errors_are_clear():
    with pytest.raises(ValueError, match="Failed to import workflow from string 'no_such_pkg.X'"):
        resolve_workflow("no_such_pkg.X")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        import_from_string("tests.proxy.agents.Missing")
    with pytest.raises(ValueError, match="not of the form"):
        import_from_string("justaname")


def test_agent_class_and_instance_are_wrapped_with_proxy_settings():
    wf = resolve_workflow(
        agents.ChatAgent, None, **PROXY, discount=0.9, export_style="concat", agent_timeout=5
    )
    assert isinstance(wf, OpenAIProxyWorkflow)
    assert (wf.mode, wf.discount, wf.export_style, wf.agent_timeout) == ("inline", 0.9, "concat", 5)
    assert isinstance(wf.agent, agents.ChatAgent) and wf.agent.turns == 1
    inst = resolve_workflow(agents.AGENT_INSTANCE, **PROXY)
    assert inst.agent is agents.AGENT_INSTANCE


def test_agent_needs_proxy_addr_and_admin_key_and_a_run_method():
    with pytest.raises(ValueError, match="proxy_addr is required for agent workflows"):
        resolve_workflow(agents.ChatAgent)
    with pytest.raises(ValueError, match="admin_api_key is required"):
        resolve_workflow(agents.ChatAgent, proxy_addr="http://127.0.0.1:1")
    with pytest.raises(TypeError, match="neither a RolloutWorkflow nor an agent"):
        resolve_workflow(dict, **PROXY)
    with pytest.raises(TypeError, match="neither a RolloutWorkflow nor an agent"):
        resolve_workflow(object(), **PROXY)
    with pytest.raises(TypeError, match="must be `async def` in inline mode"):
        resolve_workflow(agents.SyncRunAgent, **PROXY)
    # a sync run is fine in subproc mode (asyncio.run only wraps awaitables)
    assert resolve_workflow(agents.SyncRunAgent, **PROXY, mode="subproc").mode == "subproc"
    with pytest.raises(ValueError, match="workflow is None"):
        resolve_workflow(None)
    with pytest.raises(ValueError, match="mode must be one of"):
        resolve_workflow(agents.ChatAgent, **PROXY, mode="online")


def test_group_size_wraps_and_validates():
    wf = resolve_workflow(agents.ConstWorkflow, {}, group_size=3)
    assert isinstance(wf, GroupedRolloutWorkflow) and wf.group_size == 3
    assert isinstance(wf.workflow, agents.ConstWorkflow)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="group_size must be an int >= 1"):
            resolve_workflow(agents.ConstWorkflow, {}, group_size=bad)


def test_requires_proxy():
    assert requires_proxy(agents.ChatAgent) and requires_proxy(agents.AGENT_INSTANCE)
    assert requires_proxy("tests.proxy.agents.ChatAgent")
    assert requires_proxy("no_such_pkg.X")  # fail-safe: the error surfaces at resolution
    assert not requires_proxy(agents.ConstWorkflow) and not requires_proxy(agents.CONST_WORKFLOW)
    assert not requires_proxy("tests.proxy.agents.ConstWorkflow") and not requires_proxy(None)


class _Scripted(RolloutWorkflow):
    """Member i returns outcomes[i]: a dict, None, or an exception to raise."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.calls = 0

    async def arun_episode(self, engine, data):
        i = self.calls
        self.calls += 1
        await asyncio.sleep(0)
        out = self.outcomes[i]
        if isinstance(out, Exception):
            raise out
        return out


def test_group_merges_interactions_and_keeps_member_index():
    group = GroupedRolloutWorkflow(
        _Scripted([{"a": 1, "b": 2}, RuntimeError("boom"), None, {}, {"c": 3}]), group_size=5
    )
    out = asyncio.run(group.arun_episode(None, {}))
    assert isinstance(out, GroupedTrajectory)
    assert dict(out) == {"a": 1, "b": 2, "c": 3}
    assert out.episode_of == {"a": 0, "b": 0, "c": 4}
    assert out.members == [{"a": 1, "b": 2}, None, None, None, {"c": 3}]
    assert group.last_member_errors == ["member 1 raised RuntimeError: boom"]


def test_group_all_rejected_is_none_and_duplicate_ids_are_an_error():
    group = GroupedRolloutWorkflow(_Scripted([None, RuntimeError("x")]), group_size=2)
    assert asyncio.run(group.arun_episode(None, {})) is None
    dup = GroupedRolloutWorkflow(_Scripted([{"a": 1}, {"a": 2}]), group_size=2)
    with pytest.raises(ValueError, match="interaction id 'a' appears in two episodes"):
        asyncio.run(dup.arun_episode(None, {}))


def test_group_concatenates_tensor_dicts_with_row_members():
    first = {
        "input_ids": torch.tensor([[1, 2, 3]]),
        "attention_mask": torch.ones(1, 3, dtype=torch.bool),
        "rewards": torch.tensor([1.0]),
    }
    second = {
        "input_ids": torch.tensor([[4], [5]]),
        "attention_mask": torch.ones(2, 1, dtype=torch.bool),
        "rewards": torch.tensor([0.0, 0.5]),
    }
    out = asyncio.run(GroupedRolloutWorkflow(_Scripted([first, None, second]), 3).arun_episode(None, {}))
    assert isinstance(out, GroupedTensors)
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0], [5, 0, 0]]
    assert out["attention_mask"].tolist() == [[True] * 3, [True, False, False], [True, False, False]]
    assert out["rewards"].tolist() == [1.0, 0.0, 0.5]
    assert out.episode_of_row == [0, 2, 2]


def test_group_rejects_bad_construction():
    with pytest.raises(ValueError, match="group_size must be an int >= 1"):
        GroupedRolloutWorkflow(agents.ConstWorkflow(), 0)
    with pytest.raises(TypeError, match="wraps a RolloutWorkflow"):
        GroupedRolloutWorkflow(agents.ChatAgent(), 2)


def test_an_agent_instance_logs_only_the_workflow_kwargs_the_user_set(caplog):
    """The config's default sets none, so an instance (a VerifiersAgent, any agent object) is not
    told that a default it never saw is ignored; keys the user did set are named."""
    from areal_nb.agents.math_agent import MultiTurnMathAgent
    from areal_nb.config import load_config

    agent = agents.ChatAgent()
    cfg = load_config(None, {"agent.workflow": agent})
    with caplog.at_level(logging.WARNING, logger="areal_nb.rollout.resolve"):
        assert resolve_workflow(cfg.agent.workflow, dict(cfg.agent.workflow_kwargs), **PROXY).agent is agent
    assert "ignored" not in caplog.text
    cfg = load_config(None, {"agent.workflow": agent, "agent.workflow_kwargs": {"turns": 3}})
    with caplog.at_level(logging.WARNING, logger="areal_nb.rollout.resolve"):
        resolve_workflow(cfg.agent.workflow, dict(cfg.agent.workflow_kwargs), **PROXY)
    assert "workflow_kwargs ['turns'] are ignored" in caplog.text
    # the default agent keeps its two turns without the config saying so
    default = load_config(None)
    wf = resolve_workflow(default.agent.workflow, dict(default.agent.workflow_kwargs), **PROXY)
    assert isinstance(wf.agent, MultiTurnMathAgent) and wf.agent.max_turns == 2
