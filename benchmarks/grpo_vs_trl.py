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
scored by `math_reward`. TRL runs in this process where it is installed here (the `bench` extra,
`pip install -e '.[bench]'`), and otherwise in TRL's own venv (`make peer-venvs`; `--trl-python`), in a
child process as `real_size.py` runs it.

`GrpoSetup`, `training_problems`, `run_ours`, `run_trl` and `greedy_accuracy` are also the GRPO
half of `real_size.py` (SmolLM2, TRL in its own venv): `run_trl` and `greedy_accuracy` import
only torch, datasets, transformers and TRL, so they run in a venv without areal_nb's dependencies.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIG = ROOT / "configs" / "multi_turn_math.yaml"
PEER_VENVS = Path.home() / ".cache" / "areal_nb" / "peer-venvs"  # where `make peer-venvs` puts them


@dataclasses.dataclass(frozen=True)
class GrpoSetup:
    """What both sides share (the defaults: the tiny-math comparison of this file)."""

    model: str = "tiny-math"  # a name or folder for ours; TRL gets the resolved folder
    prompts: int = 16
    group: int = 8
    max_new_tokens: int = 16
    lr: float = 2.5e-4
    lr_schedule: str = "linear"  # "linear" (to 0 over the run) or "constant", on both sides
    clip: float = 0.4
    micro_batch: int | None = None  # rows per forward/backward, gradients summed over a step (None: all)
    seed: int = 1  # the run's seed on both sides (ours: sampling and init; the problems stay the same)


class SingleTurnMathAgent:
    """One chat call, scored in-process by `math_reward` (as TRL's reward function is)."""

    seen: list[str] = []  # the prompts it was given, in the order its calls began (per process)

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        from openai import AsyncOpenAI

        from areal_nb.reward import math_reward

        SingleTurnMathAgent.seen.append(data["messages"][-1]["content"])
        client = AsyncOpenAI(
            base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0
        )
        completion = await client.chat.completions.create(model="default", messages=data["messages"])
        return math_reward(completion.choices[0].message.content or "", data["answer"])


def session_config(steps: int, setup: GrpoSetup = GrpoSetup()) -> Any:
    from areal_nb.config import load_config

    return load_config(
        CONFIG,
        [
            f"model.path={setup.model}",
            "agent.workflow=benchmarks.grpo_vs_trl.SingleTurnMathAgent",
            "agent.workflow_kwargs={}",
            "agent.chat_template_type=hf",
            "agent.export_style=individual",
            f"rollout.batch_size={setup.prompts}",
            f"rollout.group_size={setup.group}",
            f"rollout.max_new_tokens={setup.max_new_tokens}",
            f"actor.lr={setup.lr}",
            f"actor.lr_schedule={setup.lr_schedule}",
            f"actor.eps_clip={setup.clip}",
            f"total_steps={steps}",
            f"seed={setup.seed}",
            "logging.progress=false",
            "logging.eval_every=0",
            "rollout.prefetch=false",
            *([f"actor.micro_batch_size={setup.micro_batch}"] if setup.micro_batch else []),
        ],
    )


def training_problems(steps: int, setup: GrpoSetup = GrpoSetup()) -> list[dict]:
    """The Session's training problems of `steps` steps, in the order it draws them."""
    from areal_nb.session.data import DataStream, load_task_data

    cfg = session_config(steps, setup)
    stream = DataStream(cfg.data, rows=load_task_data(cfg.data).train)
    return [next(stream) for _ in range(steps * setup.prompts)]


def child_spec(
    setup: GrpoSetup, steps: int, seed: int, problems: list[dict], eval_problems: list[dict]
) -> dict:
    """What a side's child process reads (`real_size.py --child ours|trl --spec FILE`)."""
    return {
        "setup": dataclasses.asdict(setup),
        "steps": steps,
        "seed": seed,
        "problems": problems,
        "eval_problems": eval_problems,
    }


def prompts_digest(prompts: list[str]) -> str:
    """A short name of a step's set of prompts (the order of concurrent rollouts is not fixed)."""
    return hashlib.sha256("\n".join(sorted(set(prompts))).encode()).hexdigest()[:12]


def memory_gib() -> dict[str, float]:
    """This process's resident memory now and its peak so far (VmRSS, VmHWM), GiB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {
        "rss_gib": round(int(status["VmRSS"].split()[0]) / 2**20, 2),
        "peak_rss_gib": round(int(status["VmHWM"].split()[0]) / 2**20, 2),
    }


# ----------------------------------------------------------------------------- shared evaluation
def greedy_accuracy(
    model: Any,
    tokenizer: Any,
    problems: list[dict],
    reward: Callable[[str, str], float],
    max_new_tokens: int,
    batch: int = 64,
) -> float:
    """Fraction of `problems` whose greedy reply (HF generate, chat template) scores 1."""
    import torch

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
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
                replies = tokenizer.batch_decode(
                    out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
                )
                correct += sum(reward(r, p["answer"]) for r, p in zip(replies, chunk, strict=True))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return correct / len(problems)


# ----------------------------------------------------------------------------- ours
def step_line(side: str, step: int, **figures: Any) -> dict[str, Any]:
    """One step's figures as both sides print them (one JSON line each)."""
    line = {
        "side": side,
        "step": step,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()},
        **memory_gib(),
        "load": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(line), flush=True)
    return line


def run_ours(steps: int, eval_problems: list[dict], setup: GrpoSetup = GrpoSetup()) -> dict[str, Any]:
    from areal_nb.reward import math_reward
    from areal_nb.session import Session

    # the class the Session imports by its configured name (as a script this file is `__main__`)
    from benchmarks.grpo_vs_trl import SingleTurnMathAgent as agent

    with Session(session_config(steps, setup)) as session:
        model, tokenizer = session.actor.model, session.tokenizer
        before = greedy_accuracy(model, tokenizer, eval_problems, math_reward, setup.max_new_tokens)
        lines = []
        for step in range(steps):
            agent.seen.clear()
            start, cpu_start = time.perf_counter(), time.process_time()
            row = session.step()
            lines.append(
                step_line(
                    "ours",
                    step,
                    step_s=time.perf_counter() - start,
                    cpu_s=time.process_time() - cpu_start,
                    rollout_s=float(row["rollout_s"]),
                    train_s=float(row["train_seconds"]),
                    reward_mean=float(row["reward_mean"]),
                    prompts=prompts_digest(agent.seen),
                )
            )
        after = greedy_accuracy(model, tokenizer, eval_problems, math_reward, setup.max_new_tokens)
    return summary(lines, before, after)


def summary(lines: list[dict], before: float, after: float) -> dict[str, Any]:
    return {
        "step_s": statistics.median(x["step_s"] for x in lines),
        "cpu_s": statistics.median(x["cpu_s"] for x in lines),
        "steps": len(lines),
        "acc_before": before,
        "acc_after": after,
        "reward_first": lines[0]["reward_mean"],
        "reward_last": lines[-1]["reward_mean"],
        "peak_rss_gib": max(x["peak_rss_gib"] for x in lines),
        "per_step": lines,
    }


# ----------------------------------------------------------------------------- TRL
def run_trl(
    model: Any,
    tokenizer: Any,
    problems: list[dict],
    eval_problems: list[dict],
    reward: Callable[[str, str], float],
    seed: int,
    setup: GrpoSetup = GrpoSetup(),
) -> dict[str, Any]:
    """TRL's `GRPOTrainer` over `problems` in their order, one step per `setup.prompts` of them.

    Its step's generation time is the time in `_generate_and_score_completions` (HF `generate`,
    the rewards and the old log-probs; our rollout time covers the same), its training time the
    rest of the step."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(seed)
    steps = len(problems) // setup.prompts
    dataset = Dataset.from_list([{"prompt": p["messages"], "answer": p["answer"]} for p in problems])
    seen: list[str] = []
    rewards: list[float] = []

    def reward_fn(
        prompts: list[list[dict]], completions: list[list[dict]], answer: list[str], **_: Any
    ) -> list[float]:
        seen.extend(p[-1]["content"] for p in prompts)
        scores = [reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]
        rewards.extend(scores)
        return scores

    generation_s: list[float] = []

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.lines: list[dict] = []

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            seen.clear()
            rewards.clear()
            generation_s.clear()
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            step_s = time.perf_counter() - self.start
            self.lines.append(
                step_line(
                    "trl",
                    len(self.lines),
                    step_s=step_s,
                    cpu_s=time.process_time() - self.cpu_start,
                    rollout_s=sum(generation_s),
                    train_s=step_s - sum(generation_s),
                    reward_mean=statistics.fmean(rewards) if rewards else float("nan"),
                    prompts=prompts_digest(seen),
                )
            )

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=seed,
            max_steps=steps,
            # one optimizer step per generation batch of prompts x group rows, in micro-batches
            per_device_train_batch_size=setup.micro_batch or setup.prompts * setup.group,
            num_generations=setup.group,
            gradient_accumulation_steps=setup.prompts
            * setup.group
            // (setup.micro_batch or setup.prompts * setup.group),
            num_iterations=1,
            shuffle_dataset=False,
            max_completion_length=setup.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            learning_rate=setup.lr,
            lr_scheduler_type=setup.lr_schedule,
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            epsilon=setup.clip,
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
            reward_funcs=[reward_fn],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        generate = trainer._generate_and_score_completions

        def timed_generate(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                generation_s.append(time.perf_counter() - start)

        trainer._generate_and_score_completions = timed_generate
        before = greedy_accuracy(model, tokenizer, eval_problems, reward, setup.max_new_tokens)
        trainer.train()
        after = greedy_accuracy(trainer.model, tokenizer, eval_problems, reward, setup.max_new_tokens)
    return summary(timer.lines, before, after)


def trl_side(
    args: argparse.Namespace, cfg: Any, eval_problems: list[dict], setup: GrpoSetup
) -> dict[str, Any]:
    """TRL's run: in this process where TRL is installed, else in a child in TRL's venv."""
    import importlib.util

    problems = training_problems(args.steps, setup)
    if importlib.util.find_spec("trl") is None:
        if not Path(args.trl_python).exists():
            raise SystemExit(
                f"TRL is not installed here and {args.trl_python} does not exist: make peer-venvs"
            )
        from areal_nb.models import resolve_model_path
        from benchmarks.real_size import run_child

        # the child loads the model with stock transformers, from the built-in model's folder
        folder = dataclasses.replace(setup, model=str(resolve_model_path(cfg.model.path)))
        spec = child_spec(folder, args.steps, cfg.seed, problems, eval_problems)
        return run_child(args.trl_python, "trl", spec)
    import torch

    from areal_nb.models import load_model, load_tokenizer
    from areal_nb.reward import math_reward

    model = load_model(cfg.model.path, dtype=torch.float32, device="cpu")
    tokenizer = load_tokenizer(cfg.model.path)
    return run_trl(model, tokenizer, problems, eval_problems, math_reward, cfg.seed, setup)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=12, help="training steps per side (median over them; >= 10)"
    )
    parser.add_argument("--eval-size", type=int, default=200, help="held-out problems for greedy accuracy")
    parser.add_argument("--only", choices=("ours", "trl"), help="run one side only")
    parser.add_argument("--seed", type=int, default=GrpoSetup.seed, help="the run's seed on both sides")
    parser.add_argument(
        "--trl-python",
        default=str(PEER_VENVS / "trl-venv" / "bin" / "python"),
        help="python of TRL's venv, used where TRL is not installed in this one",
    )
    args = parser.parse_args()

    from areal_nb.session.data import load_task_data

    setup = GrpoSetup(seed=args.seed)
    cfg = session_config(args.steps, setup)
    eval_problems = load_task_data(cfg.data).held_out[: args.eval_size]
    result: dict[str, Any] = {}
    if args.only in (None, "ours"):
        result["ours"] = run_ours(args.steps, eval_problems, setup)
    if args.only in (None, "trl"):
        result["trl"] = trl_side(args, cfg, eval_problems, setup)
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
