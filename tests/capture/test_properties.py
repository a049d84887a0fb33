"""Property-based tests over random conversation forests (hypothesis), real tiny-math tokenizer.

Each generated call either starts a new conversation or continues an earlier call after a tool
result or a user turn; replies may be truncated by length. Calls go through `ArealOpenAI` in
concat mode on a ScriptedEngine that records exactly what it saw and produced.
"""

from __future__ import annotations

import asyncio
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_nb.capture import ArealOpenAI
from areal_nb.capture.cache import discounted_rewards
from areal_nb.testing import ScriptedEngine

# (parent index or None, gap kind, truncate?, reward or None)
call_spec = st.tuples(
    st.integers(min_value=-1, max_value=7),
    st.sampled_from(["tool", "user"]),
    st.booleans(),
    st.one_of(st.none(), st.integers(min_value=-2, max_value=3), st.floats(min_value=-1, max_value=1)),
)
forest = st.lists(call_spec, min_size=1, max_size=8)
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def build(tokenizer, specs):
    """Run the calls; returns (client, engine, intended parent index per call, interactions)."""
    engine = ScriptedEngine(
        tokenizer, lambda req: f"reply {len(engine.requests)}: {'x' * (len(engine.requests) % 3)}"
    )
    client = ArealOpenAI(engine, tokenizer, chat_template_type="concat")
    calls, parents = [], []

    async def run():
        for i, (p, gap, truncate, reward) in enumerate(specs):
            parent = p if 0 <= p < len(calls) else None
            if parent is None:
                messages = [{"role": "user", "content": f"question {i}"}]
            else:
                prev = calls[parent]
                messages = prev.messages + prev.output_message_list
                messages = messages + (
                    [{"role": "tool", "content": f"result {i}", "tool_call_id": f"t{i}"}]
                    if gap == "tool"
                    else [{"role": "user", "content": f"follow-up {i}"}]
                )
            completion = await client.chat.completions.create(
                messages=messages, max_completion_tokens=4 if truncate else 200
            )
            it = client.get_interaction(completion.id)
            if reward is not None:
                client.set_reward(completion.id, reward)
            calls.append(it)
            parents.append(parent)

    asyncio.run(run())
    return client, engine, parents, calls


def ancestors(it):
    chain = []
    while it is not None:
        chain.append(it)
        it = it.parent
    return chain[::-1]


@SETTINGS
@given(specs=forest)
def test_rows_mask_exactly_the_generated_tokens(tiny_tokenizer, specs):
    client, engine, parents, calls = build(tiny_tokenizer, specs)
    assert [c.parent for c in calls] == [calls[p] if p is not None else None for p in parents]
    for style in ("individual", "concat"):
        for leaf in client.export_interactions(style).values():
            row = leaf.to_tensor_dict()
            ids, mask, turns = (
                row["input_ids"][0].tolist(),
                row["loss_mask"][0].tolist(),
                row["turn_ids"][0].tolist(),
            )
            generated = set()
            # a concat-template call's row holds its whole chain, whichever export style
            for depth, it in enumerate(ancestors(leaf)):
                req = engine.requests[calls.index(it)]
                start = len(req.input_ids)
                out = it.model_response.output_tokens
                assert ids[:start] == req.input_ids and ids[start : start + len(out)] == out
                assert turns[start : start + len(out)] == [depth] * len(out)
                generated.update(range(start, start + len(out)))
            assert {i for i, m in enumerate(mask) if m == 1} == generated
            assert all(t == -1 for i, t in enumerate(turns) if i not in generated)


@SETTINGS
@given(specs=forest)
def test_concat_leaves_cover_every_call(tiny_tokenizer, specs):
    client, _, _, calls = build(tiny_tokenizer, specs)
    leaves = list(client.export_interactions("concat").values())
    assert len({id(x) for x in leaves}) == len(leaves)
    for it in calls:  # each call is trained in exactly as many rows as it has leaves below it
        rows_with_it = sum(1 for leaf in leaves if any(a is it for a in ancestors(leaf)))
        leaves_below = sum(1 for leaf in leaves if it in ancestors(leaf))
        assert rows_with_it == leaves_below >= 1
    for a in leaves:
        assert not any(a is not b and a in ancestors(b) for b in leaves)
    if all(sum(1 for c in calls if c.parent is it) <= 1 for it in calls):  # no branching
        covered = [id(x) for leaf in leaves for x in ancestors(leaf)]
        assert sorted(covered) == sorted(id(c) for c in calls)


@SETTINGS
@given(specs=forest, gamma=st.floats(min_value=0, max_value=1))
def test_tree_discount_never_moves_reward_between_roots(tiny_tokenizer, specs, gamma):
    client, _, _, calls = build(tiny_tokenizer, specs)
    raw = {c.interaction_id: c.reward for c in calls}
    roots = {id(c): ancestors(c)[0] for c in calls}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client.apply_reward_discount(gamma)
    for root in {id(r): r for r in roots.values()}.values():
        tree = [c for c in calls if roots[id(c)] is root]
        alone = discounted_rewards(tree, gamma, "tree", rewards=raw)
        for c in tree:
            assert c.reward == alone[c.interaction_id]
        if all(raw[c.interaction_id] in (None, 0) for c in tree):
            assert all(c.reward == 0.0 for c in tree)
