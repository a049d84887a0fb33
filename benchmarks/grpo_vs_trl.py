"""Our single-turn GRPO step against TRL's `GRPOTrainer`, one after the other in one process.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/grpo_vs_trl.py [--steps 12] [--eval-size 200]

Same configuration on both sides: the tiny-math model, the same generated training problems in
the same order (the Session's `DataStream`), the same chat-template rendering (user message,
generation prompt), 16 prompts x 8 samples, one turn, at most 16 new tokens, temperature 1,
lr 2.5e-4 decaying linearly to 0 over the run, PPO clip 0.4, group-normalised rewards, a
token-level loss mean ("dapo" in TRL), AdamW, grad-norm clip 1, no KL. Ours goes through the
Session: agent (`SingleTurnMathAgent`, one OpenAI-SDK call) → proxy → LocalEngine → GRPO actor
→ weight push. TRL's uses HF `generate` (no vLLM) and its own trainer loop.

Step time is wall time per training step (rollout + update + weight push for ours; TRL's
generation + update between two `on_step_end` callbacks), median over the steps. `cpu_s` is the
process CPU time (all threads) of the same interval: on a shared machine, where wall time mostly
measures the neighbours (and a process with more threads gets a larger share of the cores), it
is the figure that still compares the work; run with `OMP_NUM_THREADS=1` there, so idle OpenMP
threads spinning for work do not count as CPU time. Accuracy is
measured identically for both: greedy HF `generate` on the first `--eval-size` held-out problems,
scored by `math_reward`. TRL needs the `bench` extra (`pip install -e '.[bench]'`).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIG = ROOT / "configs" / "multi_turn_math.yaml"
PROMPTS, GROUP, MAX_NEW_TOKENS = 16, 8, 16
LR, CLIP = 2.5e-4, 0.4


class SingleTurnMathAgent:
    """One chat call, scored in-process by `math_reward` (as TRL's reward function is)."""

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from openai import AsyncOpenAI

        from areal_nb.reward import math_reward

        client = AsyncOpenAI(
            base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0
        )
        completion = await client.chat.completions.create(model="default", messages=data["messages"])
        return math_reward(completion.choices[0].message.content or "", data["answer"])


def session_config(steps: int) -> Any:
    from areal_nb.config import load_config

    return load_config(
        CONFIG,
        [
            "agent.workflow=benchmarks.grpo_vs_trl.SingleTurnMathAgent",
            "agent.workflow_kwargs={}",
            "agent.chat_template_type=hf",
            "agent.export_style=individual",
            f"rollout.batch_size={PROMPTS}",
            f"rollout.group_size={GROUP}",
            f"rollout.max_new_tokens={MAX_NEW_TOKENS}",
            f"actor.lr={LR}",
            f"actor.eps_clip={CLIP}",
            f"total_steps={steps}",
            "logging.progress=false",
            "logging.eval_every=0",
            "rollout.prefetch=false",
        ],
    )


# ----------------------------------------------------------------------------- shared evaluation
def greedy_accuracy(model: Any, tokenizer: Any, problems: list[dict], batch: int = 64) -> float:
    """Fraction of `problems` whose greedy reply (HF generate, chat template) scores 1."""
    import torch

    from areal_nb.reward import math_reward

    was_training = model.training
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    correct = 0.0
    try:
        with torch.no_grad():
            for i in range(0, len(problems), batch):
                chunk = problems[i : i + batch]
                texts = [
                    tokenizer.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
                    for p in chunk
                ]
                enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
                    model.device
                )
                out = model.generate(
                    **enc,
                    max_new_tokens=MAX_NEW_TOKENS,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
                replies = tokenizer.batch_decode(
                    out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
                )
                correct += sum(math_reward(r, p["answer"]) for r, p in zip(replies, chunk, strict=True))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return correct / len(problems)


# ----------------------------------------------------------------------------- ours
def run_ours(steps: int, eval_problems: list[dict]) -> dict[str, Any]:
    from areal_nb.session import Session

    with Session(session_config(steps)) as session:
        model, tokenizer = session.actor.model, session.tokenizer
        before = greedy_accuracy(model, tokenizer, eval_problems)
        times, cpu, rewards = [], [], []
        for _ in range(steps):
            start, cpu_start = time.perf_counter(), time.process_time()
            row = session.step()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            rewards.append(row["reward_mean"])
            print(
                json.dumps(
                    {
                        "side": "ours",
                        "step_s": round(times[-1], 3),
                        "cpu_s": round(cpu[-1], 3),
                        "reward_mean": row["reward_mean"],
                        "rollout_s": round(row["rollout_s"], 3),
                        "train_s": round(row["train_seconds"], 3),
                    }
                ),
                flush=True,
            )
        after = greedy_accuracy(model, tokenizer, eval_problems)
    return {
        "step_s": statistics.median(times),
        "cpu_s": statistics.median(cpu),
        "steps": steps,
        "acc_before": before,
        "acc_after": after,
        "reward_first": rewards[0],
        "reward_last": rewards[-1],
    }


# ----------------------------------------------------------------------------- TRL
def run_trl(steps: int, eval_problems: list[dict]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from areal_nb.models import load_model, load_tokenizer
    from areal_nb.reward import math_reward
    from areal_nb.session.data import DataStream, load_task_data

    cfg = session_config(steps)
    torch.manual_seed(cfg.seed)
    stream = DataStream(cfg.data, rows=load_task_data(cfg.data).train)  # the Session's prompts, in its order
    problems = [next(stream) for _ in range(steps * PROMPTS)]
    dataset = Dataset.from_list([{"prompt": p["messages"], "answer": p["answer"]} for p in problems])
    tokenizer = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path, dtype=torch.float32, device="cpu")

    def reward(completions: list[list[dict]], answer: list[str], **_: Any) -> list[float]:
        return [math_reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.cpu_marks: list[float] = []

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter())
            self.cpu_marks.append(time.process_time())

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter())
            self.cpu_marks.append(time.process_time())
            print(
                json.dumps(
                    {
                        "side": "trl",
                        "step_s": round(self.marks[-1] - self.marks[-2], 3),
                        "cpu_s": round(self.cpu_marks[-1] - self.cpu_marks[-2], 3),
                    }
                ),
                flush=True,
            )

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=cfg.seed,
            max_steps=steps,
            per_device_train_batch_size=PROMPTS * GROUP,
            num_generations=GROUP,
            gradient_accumulation_steps=1,
            num_iterations=1,
            shuffle_dataset=False,
            max_completion_length=MAX_NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            learning_rate=LR,
            lr_scheduler_type="linear",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            epsilon=CLIP,
            beta=0.0,
            scale_rewards="group",
            loss_type="dapo",
            dataloader_num_workers=0,
            disable_tqdm=True,
            # TRL turns activation checkpointing on by default, which also makes HF `generate`
            # run without its KV cache; we checkpoint nothing, so neither does TRL here.
            gradient_checkpointing=False,
            # float32 like ours: TRL defaults to bf16 autocast, which on a CPU without bf16
            # matmul units is many times slower.
            bf16=False,
            fp16=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        before = greedy_accuracy(model, tokenizer, eval_problems)
        trainer.train()
        after = greedy_accuracy(trainer.model, tokenizer, eval_problems)
    times = [b - a for a, b in zip(timer.marks, timer.marks[1:], strict=False)]
    cpu = [b - a for a, b in zip(timer.cpu_marks, timer.cpu_marks[1:], strict=False)]
    return {
        "step_s": statistics.median(times),
        "cpu_s": statistics.median(cpu),
        "steps": len(times),
        "acc_before": before,
        "acc_after": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=12, help="training steps per side (median over them; >= 10)"
    )
    parser.add_argument("--eval-size", type=int, default=200, help="held-out problems for greedy accuracy")
    parser.add_argument("--only", choices=("ours", "trl"), help="run one side only")
    args = parser.parse_args()

    from areal_nb.session.data import load_task_data

    eval_problems = load_task_data(session_config(args.steps).data).held_out[: args.eval_size]
    result: dict[str, Any] = {}
    if args.only in (None, "ours"):
        result["ours"] = run_ours(args.steps, eval_problems)
    if args.only in (None, "trl"):
        result["trl"] = run_trl(args.steps, eval_problems)
    if "ours" in result and "trl" in result:
        result["ours_over_trl"] = result["ours"]["step_s"] / result["trl"]["step_s"]
        result["ours_over_trl_cpu"] = result["ours"]["cpu_s"] / result["trl"]["cpu_s"]
    for side, r in result.items():
        if isinstance(r, dict):
            print(
                f"{side:>5}: {r['step_s']:.2f} s/step, {r['cpu_s']:.2f} CPU s/step (median of {r['steps']}), held-out greedy accuracy "
                f"{r['acc_before']:.3f} -> {r['acc_after']:.3f}"
            )
    if "ours_over_trl" in result:
        print(
            f"ours / TRL step time: {result['ours_over_trl']:.2f}x (target <= 1.0); CPU time per step: "
            f"{result['ours_over_trl_cpu']:.2f}x; load average {os.getloadavg()[0]:.1f}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
