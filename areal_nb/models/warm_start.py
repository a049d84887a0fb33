"""Build the `tiny-math` model: a small Qwen2 trained briefly (SFT) on the generated problems.

The warm start stops well before convergence: the model answers about half of the held-out
problems (so most GRPO groups hold both right and wrong answers) and leaves room for RL.
Measured with a bare single-turn GRPO loop (16 prompts x 8 samples, lr 3e-4, checks every
20 steps): from 120 SFT steps (accuracy 0.105) RL gained +0 to +3 points by step 100, from 300
steps (0.205) +8 and +13.5 by step 100 (two seeds), from 500 steps (about half right) between -1 and
+28.5 depending on the seed and the step; at lr 1.5e-4 from 500 steps, +21 to +31 at every
check from step 20 to 80.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from areal_nb.data import (
    CORRECTION_PROMPT,
    TaskConfig,
    generate_problems,
    reference_reply,
    reply_for,
)

from .evaluation import evaluate_accuracy

# The built-in models' size (tiny-tools has tiny-math's).
ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
}
SFT_RECIPE = {
    "seed": 0,
    **ARCHITECTURE,
    "steps": 500,
    "batch_size": 32,
    "lr": 1e-3,
    "warmup_steps": 10,
    # Every 5th batch is two-turn (wrong answer, CORRECTION_PROMPT, right answer); those
    # sequences are ~4x longer, so their batches are smaller to cost about the same.
    "two_turn_every": 5,
    "two_turn_batch_size": 8,
    "eval_problems": 200,
}
IGNORE = -100


def _sft_example(tokenizer, problem: dict, rng: random.Random, two_turn: bool):
    """(input_ids, labels) with loss on the final assistant reply and its `<|im_end|>` only."""
    prompt = list(problem["messages"])
    if two_turn:
        # A wrong first answer is context only: we never train the model to produce it.
        value = int(problem["answer_value"])
        wrong = max(0, value + rng.choice([-3, -2, -1, 1, 2, 3]))
        wrong = wrong if wrong != value else value + 1
        prompt += [
            {"role": "assistant", "content": reply_for(problem, wrong)},
            {"role": "user", "content": CORRECTION_PROMPT},
        ]
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    reply_ids = tokenizer.encode(reference_reply(problem), add_special_tokens=False)
    reply_ids.append(tokenizer.eos_token_id)
    return prompt_ids + reply_ids, [IGNORE] * len(prompt_ids) + reply_ids


def sft_batches(tokenizer, recipe: dict = SFT_RECIPE) -> list[list[tuple[list[int], list[int]]]]:
    """The SFT batches in training order, deterministic by `recipe["seed"]`.

    Two-turn examples get batches of their own (every k-th step) instead of padding every
    batch to their length.
    """
    every = recipe["two_turn_every"]
    two_turn = [bool(every) and step % every == every - 1 for step in range(recipe["steps"])]
    sizes = [recipe["two_turn_batch_size"] if t else recipe["batch_size"] for t in two_turn]
    problems = generate_problems(sum(sizes), seed=recipe["seed"], split="train")
    rng = random.Random(recipe["seed"])
    batches, start = [], 0
    for size, is_two_turn in zip(sizes, two_turn, strict=True):
        chunk = problems[start : start + size]
        batches.append([_sft_example(tokenizer, p, rng, is_two_turn) for p in chunk])
        start += size
    return batches


def _batch(examples, pad_id: int):
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, lab) in enumerate(examples):  # right padding keeps position ids simple
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(lab)] = torch.tensor(lab)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention


def new_model(tokenizer, recipe: dict = SFT_RECIPE):
    """A freshly initialised Qwen2ForCausalLM sized by `recipe` (seeded by the caller)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_attention_heads"],
        max_position_embeddings=recipe["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


def train_sft(model, tokenizer, batches, recipe: dict, desc: str) -> list[float]:
    """The warm-start loop of the built-in models: AdamW with a linear warm-up, one step per batch
    of `(input_ids, labels)` examples; leaves the model in eval mode and returns the losses."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / recipe["warmup_steps"])
    )
    model.train()
    losses = []
    # A progress bar only: it reads the loss, never the random state, so the weights are the same.
    progress = tqdm(batches, desc=desc, unit="step", mininterval=1.0)
    for examples in progress:
        input_ids, labels, attention = _batch(examples, tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        progress.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    progress.close()
    model.eval()
    return losses


def save_model(model, tokenizer, out_dir: Path) -> None:
    """Weights and tokenizer in one folder, generation config pointing at the tokenizer's EOS/PAD."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def build_model(out_dir: Path, tokenizer_dir: Path, recipe: dict = SFT_RECIPE) -> dict:
    """Warm-start the model, measure held-out accuracy, save model + tokenizer + build_info.json."""
    held_out = generate_problems(recipe["eval_problems"], split="test")
    task = TaskConfig().__dict__ | {"operations": list(TaskConfig().operations)}
    return warm_start(
        "tiny-math",
        out_dir,
        tokenizer_dir,
        recipe,
        sft_batches,
        (held_out, evaluate_accuracy, "accuracy"),
        {"task": task},
    )


def warm_start(
    name: str,
    out_dir: Path,
    tokenizer_dir: Path,
    recipe: dict,
    batches: Callable[[Any, dict], list],
    measure: tuple[list[dict], Callable[[Any, Any, list[dict]], float], str],
    about: dict | None = None,
) -> dict:
    """A built-in model's build, on one torch thread: a fresh model (seeded by `recipe`) trained by
    `train_sft` on `batches(tokenizer, recipe)`, scored by `measure` = (held_out rows,
    score(model, tokenizer, held_out), the figure's name: "accuracy" gives `held_out_accuracy`),
    saved with its tokenizer into `out_dir`. Returns the build info it writes there as
    `build_info.json`: name, recipe, `about`, the score, the loss and the time taken."""
    import torch
    from transformers import AutoTokenizer

    # One thread: on a shared 2-core machine two OpenMP threads spin against other processes
    # and run ~3x slower, and a fixed thread count keeps the float sums (so the result) stable.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        started = time.monotonic()
        torch.manual_seed(recipe["seed"])
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        model = new_model(tokenizer, recipe)
        losses = train_sft(
            model, tokenizer, batches(tokenizer, recipe), recipe, desc=f"{name} warm start (SFT)"
        )
        train_seconds = time.monotonic() - started
        held_out, score, figure = measure
        tqdm.write(
            f"{name}: measuring greedy {figure} on {len(held_out)} held-out problems …", file=sys.stderr
        )
        info = {"name": name, "recipe": recipe, **(about or {})}
        info |= {
            "parameters": sum(p.numel() for p in model.parameters()),
            f"held_out_{figure}": score(model, tokenizer, held_out),
            "held_out_problems": len(held_out),
            "final_loss": sum(losses[-10:]) / len(losses[-10:]),
            "train_seconds": round(train_seconds, 1),
        }
        save_model(model, tokenizer, out_dir)
        info |= {
            "build_seconds": round(time.monotonic() - started, 1),
            "torch_threads": torch.get_num_threads(),
        }
        (out_dir / "build_info.json").write_text(json.dumps(info, indent=2))
        return info
    finally:
        torch.set_num_threads(threads)
