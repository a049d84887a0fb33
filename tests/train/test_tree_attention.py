"""The flat layout of packed tries (`pack_rows(flat=True)`): attention over each node's ancestors
only (`tree_attention.py`) equals the dense tree mask, values and gradients; log-probs equal the
padded rows'; the LM head, and the last layer's queries and MLP, run only where log-probs are asked
for; models that cannot take it fall back to the dense layout."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from areal_nb.api.train_batch import TrainBatch
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.head_forward import supports_head_forward
from areal_nb.train.logprobs import compute_token_logprobs_and_entropy
from areal_nb.train.packing import (
    _ancestor_mask,
    _segments,
    build_trie,
    count_unique_tokens,
    pack_rows,
    packed_token_logprobs_and_entropy,
)
from areal_nb.train.tree_attention import plan_tree_attention, supports_tree_attention, tree_attention_forward

from .conftest import make_tiny_qwen2
from .test_packing import TOL, grads_after_step, make_batch, rows_and_masks


def random_rows(seed: int, n_rows: int = 12) -> list[list[int]]:
    """Rows that share prefixes at random depths: a 9-token prompt, then branches copied from
    earlier rows for a random length before they diverge."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, 40, (9,), generator=gen).tolist()
    rows = []
    for _ in range(n_rows):
        row = list(prompt)
        if rows and torch.rand((), generator=gen) < 0.7:
            donor = rows[int(torch.randint(len(rows), (), generator=gen))]
            row = donor[: int(torch.randint(len(prompt), len(donor) + 1, (), generator=gen))]
        row += torch.randint(2, 40, (int(torch.randint(1, 14, (), generator=gen)),), generator=gen).tolist()
        rows.append(row)
    return rows


@pytest.mark.parametrize("chunk", [1, 3, 96])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_tree_attention_equals_the_dense_tree_mask(chunk, kv_heads):
    tokens, parents, depths, paths = build_trie(random_rows(seed=chunk + kv_heads))
    n = len(tokens)
    plan = plan_tree_attention(_segments([(tokens, parents, depths, paths)], [0, n]), n, chunk=chunk)
    # pairs computed: every ancestor pair; with short chunks fewer than the dense n² (a plan this
    # small joins its chunks into one call, and whole segments pad to the longest)
    ancestors = _ancestor_mask(torch.tensor([parents]), torch.tensor([depths]))[0]
    assert int(ancestors.sum()) <= plan.pairs and (chunk > 3 or plan.pairs < n * n)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, n, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, n, 8, generator=gen, requires_grad=True) for _ in range(2))
    got, _ = tree_attention_forward(None, q, k, v, plan, scaling=0.3)  # [1, n, H, D]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=ancestors, scale=0.3, enable_gqa=kv_heads != 4)
    want = want.transpose(1, 2)
    assert (got - want).abs().max() < 1e-6
    weights = torch.randn(got.shape, generator=gen)
    got_grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    want_grads = torch.autograd.grad((want * weights).sum(), (q, k, v))
    for a, b in zip(got_grads, want_grads, strict=True):
        assert (a - b).abs().max() < 1e-5


def test_a_plan_for_some_queries_equals_those_rows_of_the_dense_attention():
    rows = random_rows(seed=5)
    tokens, parents, depths, paths = build_trie(rows)
    n = len(tokens)
    # queries: runs along the rows' paths (as the last layer's heads are), each node in one run
    runs, queries = [], []
    for path in paths:
        for lo in range(1, len(path), 4):
            new = [node for node in path[lo : lo + 2] if node not in queries]
            if new == path[lo : lo + len(new)] and new:
                runs.append((path, lo, lo + len(new)))
                queries += new
    assert len(runs) >= 3 and len(queries) > len(runs)
    plan = plan_tree_attention(runs, n, chunk=3, queries=queries)
    ancestors = _ancestor_mask(torch.tensor([parents]), torch.tensor([depths]))[0]
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, n, 8, generator=gen)
    k, v = (torch.randn(1, 2, n, 8, generator=gen, requires_grad=True) for _ in range(2))
    q_some = q[:, :, queries].clone().requires_grad_(True)
    got, _ = tree_attention_forward(None, q_some, k, v, plan, scaling=0.3)  # [1, Q, H, D]
    want = F.scaled_dot_product_attention(
        q_some, k, v, attn_mask=ancestors[queries], scale=0.3, enable_gqa=True
    )
    want = want.transpose(1, 2)
    assert got.shape == (1, len(queries), 4, 8) and (got - want).abs().max() < 1e-6
    weights = torch.randn(got.shape, generator=gen)
    for a, b in zip(
        torch.autograd.grad((got * weights).sum(), (q_some, k, v)),
        torch.autograd.grad((want * weights).sum(), (q_some, k, v)),
        strict=True,
    ):
        assert (a - b).abs().max() < 1e-5
    with pytest.raises(ValueError, match="queries"):
        plan_tree_attention(runs, n, queries=queries[:-1])


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("make_model", [make_tiny_qwen2, tiny_llama], ids=["qwen2", "llama"])
def test_the_last_layer_runs_at_the_heads_only(make_model):
    model = make_model()
    rows, groups = rows_and_masks()
    batch = make_batch(model, rows)
    ids, attention, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"].bool()
    packed = pack_rows(ids, attention, groups, flat=True)
    mlp_rows = []  # rows each layer's MLP computed
    hooks = [
        layer.mlp.register_forward_hook(lambda _m, inputs, _o: mlp_rows.append(inputs[0].numel() // 32))
        for layer in model.model.layers
    ]
    with torch.no_grad():
        want_lp, _ = compute_token_logprobs_and_entropy(model, ids, attention)
        mlp_rows.clear()
        got_lp, _ = packed_token_logprobs_and_entropy(model, packed, positions=loss_mask)
    for hook in hooks:
        hook.remove()
    parents_of_generated = len(torch.unique(packed.node_of[:, :-1][loss_mask[:, 1:]]))
    assert supports_head_forward(model)
    assert mlp_rows == [packed.n_nodes] * (len(model.model.layers) - 1) + [parents_of_generated]
    assert (got_lp - want_lp)[loss_mask].abs().max() < TOL


def test_flat_layout_is_one_trie_of_all_rows():
    ids = torch.tensor([[2, 3, 4, 0], [2, 3, 5, 6], [7, 0, 0, 0], [2, 3, 4, 0]])
    attention = ids > 0
    packed = pack_rows(ids, attention, [0, 0, 1, 1], flat=True)
    assert packed.input_ids.tolist() == [[2, 3, 4, 5, 6, 7]]  # across the groups: "2 3 4" stored once
    assert packed.node_of.tolist() == [[0, 1, 2, -1], [0, 1, 3, 4], [5, -1, -1, -1], [0, 1, 2, -1]]
    assert packed.n_nodes == count_unique_tokens(ids, attention) == 6 and packed.tree_mask is None
    # each row's new nodes are one segment, keyed by the row's path (the duplicate row adds none)
    assert _segments([build_trie([[2, 3, 4], [2, 3, 5, 6], [7], [2, 3, 4]])], [0, 6]) == [
        ([0, 1, 2], 0),
        ([0, 1, 3, 4], 2),
        ([5], 0),
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_flat_logprobs_equal_the_padded_rows_and_skip_unasked_positions(temperature):
    model = make_tiny_qwen2()
    rows, groups = rows_and_masks()
    batch = make_batch(model, rows)
    ids, attention, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"].bool()
    packed = pack_rows(ids, attention, groups, flat=True)
    assert packed.n_nodes == count_unique_tokens(ids, attention)
    heads = []  # rows the LM head computed
    hook = model.lm_head.register_forward_hook(lambda _m, inputs, _o: heads.append(inputs[0].numel() // 32))
    with torch.no_grad():
        want_lp, want_ent = compute_token_logprobs_and_entropy(model, ids, attention, temperature)
        got_lp, got_ent = packed_token_logprobs_and_entropy(model, packed, temperature)
        masked_lp, masked_ent = packed_token_logprobs_and_entropy(
            model, packed, temperature, positions=loss_mask
        )
    hook.remove()
    assert (got_lp[~attention] == 0).all() and (got_lp[:, 0] == 0).all()
    assert (got_lp - want_lp)[attention].abs().max() < TOL
    assert (got_ent - want_ent)[attention].abs().max() < TOL
    assert (masked_lp - want_lp)[loss_mask].abs().max() < TOL and (masked_ent - want_ent)[
        loss_mask
    ].abs().max() < TOL
    assert (masked_lp[~loss_mask] == 0).all() and (masked_ent[~loss_mask] == 0).all()
    # the padded rows' forward computes every position; the flat one each node with a child, and
    # with the loss mask only the parents of generated tokens
    with_child = len(torch.unique(packed.parents[packed.parents >= 0]))
    parents_of_generated = len(torch.unique(packed.node_of[:, :-1][loss_mask[:, 1:]]))
    assert heads == [ids.numel(), with_child, parents_of_generated]
    assert parents_of_generated < with_child < packed.n_nodes


@pytest.mark.parametrize("tree_attention", [True, False], ids=["flat", "dense"])
def test_both_layouts_step_like_the_padded_rows(tree_attention):
    model = make_tiny_qwen2()
    rows, groups = rows_and_masks()
    batch = make_batch(model, rows)
    batch["logprobs"] = batch["logprobs"] - 0.3 * batch["loss_mask"] * (
        torch.arange(batch["logprobs"].shape[1]) % 2
    )
    padded, padded_grads = grads_after_step({"use_decoupled_loss": True, "pack": False}, batch, groups)
    packed, packed_grads = grads_after_step(
        {"use_decoupled_loss": True, "tree_attention": tree_attention}, batch, groups
    )
    assert abs(packed["loss"] - padded["loss"]) < TOL and padded["loss"] != 0
    assert max(float((a - b).abs().max()) for a, b in zip(packed_grads, padded_grads, strict=True)) < TOL
    for key in ("entropy", "clip_frac", "logprob_abs_diff_max", "behave_imp_weight_mean"):
        assert packed[key] == pytest.approx(padded[key], abs=TOL)
    unique = count_unique_tokens(batch["input_ids"], batch["attention_mask"])
    assert packed["train_positions"] == unique if tree_attention else packed["train_positions"] > unique


def test_models_without_the_attention_interface_use_the_dense_layout():
    sliding = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=48,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=0,
        )
    )
    assert supports_tree_attention(make_tiny_qwen2()) and not supports_tree_attention(sliding)
    assert not supports_tree_attention(torch.nn.Linear(2, 2))
    # a sliding-window model still trains, packed densely
    rows, groups = rows_and_masks()
    batch = make_batch(sliding.eval(), rows)
    stats = Actor(sliding, GRPOConfig()).train_step(TrainBatch(**batch, group_ids=torch.as_tensor(groups)))
    assert stats["train_positions"] > count_unique_tokens(batch["input_ids"], batch["attention_mask"])


def test_a_micro_batch_without_generated_tokens_runs_an_empty_lm_head():
    model = make_tiny_qwen2()
    rows, groups = rows_and_masks()
    batch = make_batch(model, rows)
    batch["loss_mask"][:8] = 0  # group 0, the first micro-batch of 8 rows, has nothing to train
    batch["logprobs"] = batch["logprobs"] * batch["loss_mask"]
    padded, padded_grads = grads_after_step({"pack": False, "micro_batch_size": 8}, batch, groups)
    packed, packed_grads = grads_after_step({"micro_batch_size": 8}, batch, groups)
    assert abs(packed["loss"] - padded["loss"]) < TOL and padded["loss"] != 0
    assert max(float((a - b).abs().max()) for a, b in zip(packed_grads, padded_grads, strict=True)) < TOL
