"""One Actor train step of the tiny-math model on a fixed batch, per case of `CASES`.

`python -m torch.distributed.run --nproc-per-node 2 tests/train/ddp_step.py OUT.pt [ddp|fsdp]` trains
data-parallel (gloo; replicas, or FSDP2 shards with `fsdp`); rank 0 writes each case's weights, Adam first moment (= 0.1 × the gradient after
one step) and stats to OUT.pt. `one_process_step(case)` is the same step in one process.
Used by tests/train/test_distributed.py.
"""

from __future__ import annotations

import sys

import torch

from areal_nb.api.train_batch import TrainBatch
from areal_nb.models import load_model
from areal_nb.train import Actor, GRPOConfig
from areal_nb.train.distributed import DataParallel, full_state_dict, init_from_env

# Five rows of very different lengths (5 rows on 2 ranks do not split evenly), two groups.
LENGTHS = [41, 6, 23, 5, 30]
PROMPT = 4
GROUPS = [0, 0, 0, 1, 1]
REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0]
# Adam's first step moves a weight by lr·g/(|g| + 1e-8): for the gradients of size ~1e-9 that
# float rounding alone changes by 1e-11, that step moves by ~lr/10. With lr 1e-4 those stay under
# 1e-5; the gradients themselves are compared to float rounding (test_distributed.py).
LR = 1e-4
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}

CASES: dict[str, dict] = {
    "default": {},  # packed, one minibatch, skipped recomputation
    "minibatches_micro_padded": {"ppo_n_minibatches": 2, "micro_batch_size": 1, "pack": False},
    # one row per optimizer step: in every minibatch one of the two ranks has no row to train
    "one_row_minibatches": {"ppo_n_minibatches": 5},
    "decoupled_recompute_kl": {
        "use_decoupled_loss": True,
        "skip_redundant_recompute": False,
        "kl_ctl": 0.1,
        "adv_norm": "batch",
        "micro_batch_size": 2,
    },
    # LoRA adapters (peft injected before FSDP shards the layers): only they train; the KL
    # reference is the base with the adapters off
    "lora": {"lora": LORA},
    "lora_decoupled_kl": {"lora": LORA, "use_decoupled_loss": True, "kl_ctl": 0.1, "micro_batch_size": 2},
}


def fixed_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    rows, width = len(LENGTHS), max(LENGTHS)
    batch = {
        "input_ids": torch.zeros(rows, width, dtype=torch.long),
        "attention_mask": torch.zeros(rows, width, dtype=torch.bool),
        "loss_mask": torch.zeros(rows, width, dtype=torch.long),
        "logprobs": torch.zeros(rows, width),
        "versions": torch.full((rows, width), -1, dtype=torch.long),
        "rewards": torch.tensor(REWARDS),
    }
    prompt = torch.randint(3, vocab_size, (PROMPT,), generator=gen)  # one prompt per group: shared prefixes
    for i, n in enumerate(LENGTHS):
        tokens = torch.randint(3, vocab_size, (n,), generator=gen)
        tokens[: min(PROMPT, n - 1)] = prompt[: min(PROMPT, n - 1)] + GROUPS[i]
        batch["input_ids"][i, :n] = tokens
        batch["attention_mask"][i, :n] = True
        generated = slice(min(PROMPT, n - 1), n)
        batch["loss_mask"][i, generated] = 1
        # an engine record that is off the trainer's values: ratios ≠ 1, some clipped
        batch["logprobs"][i, generated] = -3.0 - 0.5 * torch.rand(n - generated.start, generator=gen)
        batch["versions"][i, generated] = 0
    return batch


def train_case(case: str, parallel: DataParallel | None, mode: str = "ddp") -> dict:
    torch.manual_seed(0)
    model = load_model("tiny-math", dtype=torch.float32, device="cpu")
    cfg = GRPOConfig(lr=LR, parallel=mode, **CASES[case])
    ref = None
    if cfg.kl_ctl > 0 and cfg.lora is None:
        import copy

        ref = copy.deepcopy(model).requires_grad_(False)
        with torch.no_grad():  # a reference that differs from the policy: the KL term is not 0
            for p in ref.parameters():
                p.mul_(0.9)
    actor = Actor(model, cfg, ref_model=ref, parallel=parallel)
    before = {k: v.clone() for k, v in actor.weights().items()}  # (fsdp: gathered from the shards)
    stats = actor.train_step(
        TrainBatch(**fixed_batch(model.config.vocab_size), group_ids=torch.as_tensor(GROUPS)), inspect=True
    )
    moments = [full_state_dict(actor.optimizer.state[p]["exp_avg"]).clone() for p in actor.params]
    return {
        "trainable": sorted(n for n, p in actor.model.named_parameters() if p.requires_grad),
        "before": before,
        "after": {k: v.clone() for k, v in actor.weights().items()},
        "exp_avg": moments,
        "stats": stats,
        "advantages": actor.last_inspection.advantages,
        "contribution": actor.last_inspection.contribution,
    }


def one_process_step(case: str) -> dict:
    return train_case(case, None)


def main(out: str, mode: str) -> None:
    parallel = init_from_env(timeout_s=120)
    assert parallel is not None, "run under torchrun (WORLD_SIZE > 1)"
    results = {case: train_case(case, parallel, mode) for case in CASES}
    # the replicas must stay equal: every rank's weights against rank 0's
    mine = torch.cat([v.flatten() for r in results.values() for v in r["after"].values()])
    others = parallel.all_gather(mine)
    results["replica_max_abs_diff"] = max(float((o - others[0]).abs().max()) for o in others)
    results["world_size"] = parallel.world_size
    if parallel.is_leader:
        torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "ddp")
