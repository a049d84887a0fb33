"""Prefix-shared training (`cfg.pack`): the token trie, and log-probs, loss and gradients equal to
the padded rows' on a fixed batch (individual and concat rows, a group of 8 sharing a prompt,
multi-turn concat rows, rows that share nothing)."""

import pytest
import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig, compute_token_logprobs
from areal_nb.train.logprobs import compute_token_logprobs_and_entropy
from areal_nb.train.packing import (
    count_unique_tokens,
    forward_groups,
    pack_rows,
    packed_token_logprobs_and_entropy,
)

from .conftest import make_tiny_qwen2

TOL = 1e-5  # float32 rounding: the packed forward sums attention over a different layout

PROMPT_A = [2, 3, 4, 5, 6]
PROMPT_B = [7, 8, 9]
USER = [40, 41, 42]  # the agent's correction prompt between two turns


def rows_and_masks():
    """(tokens, loss mask) per row and each row's group.

    group 0: 8 samples of PROMPT_A, single turn (individual rows: prompt + reply);
    group 1: 3 two-turn conversations of PROMPT_B as concat rows (reply, USER, reply), one of which
      branched after its first reply (two leaves sharing the first turn), plus the individual row
      of a first turn, which is a prefix of the concat rows;
    group 2: two rows sharing no token with each other or the rest.
    """
    rows, groups = [], []

    def add(segments, group):
        tokens = [t for seg, _ in segments for t in seg]
        mask = [int(gen) for seg, gen in segments for _ in seg]
        rows.append((tokens, mask))
        groups.append(group)

    for i in range(8):
        add([(PROMPT_A, False), ([10 + i, 11 + (i % 3), 1], True)], 0)
    add([(PROMPT_B, False), ([20, 21, 1], True), (USER, False), ([22, 23, 1], True)], 1)
    add([(PROMPT_B, False), ([20, 21, 1], True), (USER, False), ([24, 1], True)], 1)  # branch
    add([(PROMPT_B, False), ([25, 1], True), (USER, False), ([26, 27, 28, 1], True)], 1)
    add([(PROMPT_B, False), ([29, 30, 1], True)], 1)  # individual first-turn row
    add([(PROMPT_B, False), ([20, 21, 1], True)], 1)  # prefix of the first two concat rows
    add([(PROMPT_B, False), ([31, 1], True), (USER, False), ([32, 1], True)], 1)
    add([([43, 44], False), ([45, 1], True)], 2)
    add([([46], False), ([47, 1], True)], 2)
    return rows, groups


def make_batch(model, rows=None, rewards=None, version=0):
    rows = rows or rows_and_masks()[0]
    width = max(len(t) for t, _ in rows)
    pad = lambda r, v: r + [v] * (width - len(r))  # noqa: E731
    input_ids = torch.tensor([pad(t, 0) for t, _ in rows])
    attention = torch.tensor([pad([1] * len(t), 0) for t, _ in rows], dtype=torch.bool)
    loss_mask = torch.tensor([pad(m, 0) for _, m in rows])
    with torch.no_grad():
        logprobs = compute_token_logprobs(model, input_ids, attention) * loss_mask
    if rewards is None:
        rewards = [float(i % 3 == 0) for i in range(len(rows))]
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "versions": torch.where(loss_mask.bool(), version, -1),
        "rewards": torch.tensor(rewards),
    }


def test_trie_holds_each_prefix_once():
    ids = torch.tensor([[2, 3, 4, 0], [2, 3, 5, 6], [7, 0, 0, 0]])
    attention = ids > 0
    packed = pack_rows(ids, attention, [0, 0, 1])
    # pack 0: 2 3 {4 | 5 6}; pack 1: 7 (padded to 5 nodes)
    assert packed.input_ids.tolist() == [[2, 3, 4, 5, 6], [7, 0, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 2, 3], [0, 0, 0, 0, 0]]
    assert packed.parents.tolist() == [[-1, 0, 1, 1, 3], [-1, -1, -1, -1, -1]]
    assert packed.node_of.tolist() == [[0, 1, 2, -1], [0, 1, 3, 4], [5, -1, -1, -1]]
    assert packed.tree_mask[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # "4" does not see its sibling "5"
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]
    assert packed.tree_mask[1].int().tolist() == torch.eye(5, dtype=torch.int).tolist()  # padding: self only
    assert packed.lengths == [5, 1] and packed.n_nodes == 6
    assert count_unique_tokens(ids, attention) == 6
    # small tries share a sequence up to the largest one's size (first-fit decreasing), and the
    # sequence's trie shares their common prefix ("5") across packs
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0], [5, 7, 0, 0]])
    packed = pack_rows(ids, ids > 0, [0, 1, 2])
    assert packed.lengths == [4, 3]
    assert packed.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 0]]
    assert packed.node_of.tolist() == [[0, 1, 2, 3], [4, 5, -1, -1], [4, 6, -1, -1]]
    with pytest.raises(ValueError, match="pack_ids has 2 entries for 3 rows"):
        pack_rows(ids, attention, [0, 1])


def test_similar_length_sequences_share_one_forward():
    # longest first; a sequence joins while the padding stays within 1/8 of the real nodes
    assert forward_groups([48, 50, 10, 47, 9]) == [[1, 0, 3], [2, 4]]
    assert forward_groups([50, 38]) == [[0], [1]]  # 12 padding nodes for 88 real: too many
    assert forward_groups([]) == []
    # positions computed = each forward's sequences at its longest length, padding included
    ids = torch.tensor([list(range(1, 9)), list(range(9, 16)) + [0], [16, 17] + [0] * 6])
    packed = pack_rows(ids, ids > 0, [0, 1, 2])
    assert packed.lengths == [8, 7, 2] and packed.forwards == [[0, 1], [2]] and packed.n_nodes == 8 + 8 + 2


def test_packed_logprobs_and_entropy_equal_the_padded_rows():
    model = make_tiny_qwen2()
    rows, groups = rows_and_masks()
    batch = make_batch(model, rows)
    ids, attention = batch["input_ids"], batch["attention_mask"]
    packed = pack_rows(ids, attention, groups)
    assert packed.n_nodes < int(attention.sum()) * 0.6  # the shared prompts are stored once
    for temperature in (1.0, 0.7):
        with torch.no_grad():
            want_lp, want_ent = compute_token_logprobs_and_entropy(model, ids, attention, temperature)
            got_lp, got_ent = packed_token_logprobs_and_entropy(model, packed, temperature)
        assert (got_lp[~attention] == 0).all() and (got_lp[:, 0] == 0).all()
        assert (got_lp - want_lp)[attention].abs().max() < TOL
        assert (got_ent - want_ent)[attention].abs().max() < TOL


def grads_after_step(cfg_kwargs, batch, groups, seed=0):
    """Loss, stats and gradients of one train step (plain SGD with lr 1: update = -gradient)."""
    model = make_tiny_qwen2(seed)
    before = [p.detach().clone() for p in model.parameters()]
    actor = Actor(model, GRPOConfig(lr=1.0, max_grad_norm=0.0, **cfg_kwargs))
    actor.optimizer = torch.optim.SGD(actor.params, lr=1.0)
    stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(groups)))
    grads = [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]
    return stats, grads


@pytest.mark.parametrize(
    "cfg_kwargs",
    [
        {},
        {"use_decoupled_loss": True, "micro_batch_size": 5},
        {"recompute_logprob": False, "eps_clip": 0.05},
    ],
    ids=["plain", "decoupled-micro", "engine-old"],
)
def test_packed_step_has_the_loss_and_gradients_of_padded_rows(cfg_kwargs):
    model = make_tiny_qwen2()
    rows, groups = rows_and_masks()
    batch = make_batch(model, rows)
    # the engine was a little off on some tokens, so ratios and clipping are exercised
    batch["logprobs"] = batch["logprobs"] - 0.3 * batch["loss_mask"] * (
        torch.arange(batch["logprobs"].shape[1]) % 2
    )
    padded, padded_grads = grads_after_step({**cfg_kwargs, "pack": False}, batch, groups)
    packed, packed_grads = grads_after_step({**cfg_kwargs, "pack": True}, batch, groups)
    assert abs(packed["loss"] - padded["loss"]) < TOL and padded["loss"] != 0
    worst = max(float((a - b).abs().max()) for a, b in zip(packed_grads, padded_grads, strict=True))
    assert worst < TOL
    assert max(float(g.abs().max()) for g in padded_grads) > 1e-3  # the gradient is not trivially 0
    for key in ("entropy", "clip_frac", "importance_weight_mean", "adv_max"):
        assert packed[key] == pytest.approx(padded[key], abs=TOL)
    # trained positions: the padded rows [16, 12] against one trie per group (and micro-batch)
    if "micro_batch_size" not in cfg_kwargs:
        assert padded["train_positions"] == batch["input_ids"].numel() == 16 * 12
    # (micro-batches of 5 rows split group 0, which then shares its prompt less)
    assert (
        packed["train_positions"]
        < (0.7 if "micro_batch_size" in cfg_kwargs else 0.6) * padded["train_positions"]
    )
