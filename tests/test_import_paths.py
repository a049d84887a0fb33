"""AReaL's import path `areal_nb.openai` still gives the capture layer's and the proxy workflow's
names, and its old module paths are the very modules of `areal_nb.capture` (one class, not two)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import areal_nb.capture


def test_areal_names_from_areal_nb_openai():
    from areal_nb.capture import ArealOpenAI, InteractionCache, InteractionWithTokenLogpReward
    from areal_nb.openai import ArealOpenAI as A
    from areal_nb.openai import InteractionCache as C
    from areal_nb.openai import InteractionWithTokenLogpReward as I
    from areal_nb.openai import OpenAIProxyClient, OpenAIProxyWorkflow
    from areal_nb.proxy.client import OpenAIProxyClient as ProxyClient
    from areal_nb.rollout.workflow import OpenAIProxyWorkflow as Workflow

    assert (A, C, I) == (ArealOpenAI, InteractionCache, InteractionWithTokenLogpReward)
    assert OpenAIProxyClient is ProxyClient and OpenAIProxyWorkflow is Workflow
    import areal_nb.openai

    assert {
        "ArealOpenAI",
        "InteractionWithTokenLogpReward",
        "InteractionCache",
        "OpenAIProxyClient",
        "OpenAIProxyWorkflow",
    } <= set(areal_nb.openai.__all__)
    with pytest.raises(AttributeError):
        areal_nb.openai.NoSuchName  # noqa: B018


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.iter_modules(areal_nb.capture.__path__)))
def test_old_module_paths_are_the_capture_modules(name):
    old = importlib.import_module(f"areal_nb.openai.{name}")
    assert old is importlib.import_module(f"areal_nb.capture.{name}")
    import areal_nb.openai

    assert getattr(areal_nb.openai, name) is old
