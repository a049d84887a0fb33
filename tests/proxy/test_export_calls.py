"""The Session's export (`session_calls`): the agent's rewards untouched, and a conversation whose
last call has no reward said once, as the discounted export says it."""

from __future__ import annotations

import warnings

import pytest

from areal_nb.capture import InteractionCache
from areal_nb.errors import MissingRewardWarning
from areal_nb.proxy.export import session_calls
from areal_nb.proxy.state import SessionData
from tests.capture.test_cache import chain


def session_of(cache: InteractionCache) -> SessionData:
    return SessionData(session_id="s", api_key="k", cache=cache)


def test_a_leaf_without_a_reward_warns_and_the_rewards_stay_as_set():
    cache = InteractionCache()
    first, last = chain(cache, 2)
    first.reward = 1.0
    with pytest.warns(MissingRewardWarning, match="c1"):
        calls = session_calls(session_of(cache))
    assert [(c.reward, c.raw_reward) for c in calls.values()] == [(1.0, 1.0), (None, 0.0)]


def test_a_rewarded_leaf_says_nothing():
    cache = InteractionCache()
    first, last = chain(cache, 2)
    last.reward = 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingRewardWarning)
        calls = session_calls(session_of(cache))
    assert [c.raw_reward for c in calls.values()] == [0.0, 2.0]
