"""The GPU check: a Qwen2.5-0.5B-shaped model through areal_nb's GPU paths in one run (run by
`benchmarks/gpu_check.sh`, which first installs the missing pure-Python packages from wheels).

Stages, each timed, each printing one `@stage {json}` line:

1. model   A Qwen2.5-0.5B config (24 layers, hidden 896, 14 heads / 2 KV heads, vocabulary 151,936,
           tied embeddings), random init (seed 0), saved in bfloat16 with `save_pretrained`. No hub:
           the tokenizer is a stand-in, tiny-math's byte-level BPE with its id space filled up to
           the vocabulary size by placeholder tokens `<xN>`, so every sampled id decodes.
2. engine  `LocalEngine` on the device in the compute dtype generates 16 requests (output tok/s).
3. grpo    A `Session` (model.dtype = the compute dtype, model.device = the device, lr 1e-6 as the
           GPU config) trains 3 GRPO steps of a `ChatAgent` whose reward varies between samples;
           per step the recorded vs recomputed log-prob gap (`logprob_abs_diff_max`); after them
           the share of trainable weights that changed, and the trainable weights' dtype.
4. fsdp    One GRPO step through `actor.parallel=fsdp` at world size 1 (NCCL on CUDA, gloo on CPU):
           the Session's own `build_policy`/`build_actor` on a process group of one.
5. server  `areal-nb engine-server` on the device, driven by `SGLangEngine`: generate, push
           weights through the shared folder, generate at the new version.

Peak device memory (CUDA: `max_memory_allocated` of this process per stage; the server's
`nvidia-smi` used memory). The last line is one JSON object; exit code 0 only if every stage passed.

    python benchmarks/gpu_check.py --out DIR                       # on the GPU machine (cuda, bf16)
    python benchmarks/gpu_check.py --rehearse --out DIR   # = --device cpu --layers 2 --hidden 128 --vocab 8192
    python benchmarks/gpu_check.py --sglang --out DIR              # + SGLang contract tests (sglang installed)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from areal_nb.api.train_batch import TrainBatch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Qwen/Qwen2.5-0.5B-Instruct's config.json (the shape; the weights are random)
QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


# --------------------------------------------------------------------------- the model
def standin_tokenizer(vocab_size: int):
    """tiny-math's tokenizer with placeholder tokens `<xN>` up to `vocab_size` ids (all decodable)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from areal_nb.models import load_tokenizer

    tiny = load_tokenizer("tiny-math")
    spec = json.loads(tiny.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in spec["added_tokens"]}
    if vocab_size < len(taken):
        raise ValueError(f"--vocab {vocab_size} is below the tokenizer's own {len(taken)} ids")
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<x{i}>"] = i  # printable ASCII: the byte-level decoder maps it to itself
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=tiny.eos_token,
        pad_token=tiny.pad_token,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        model_max_length=QWEN25_05B["max_position_embeddings"],
    )
    tok.chat_template = tiny.chat_template
    assert len(tok) == vocab_size, (len(tok), vocab_size)
    return tok


def build_model(folder: Path, device: str, layers: int, vocab: int, hidden: int | None = None) -> dict:
    """`hidden` (a multiple of 64; rehearsals): head_dim 64 and GQA 7:1 kept, MLP 16/3 x hidden."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = standin_tokenizer(vocab)
    shape = {**QWEN25_05B, "num_hidden_layers": layers, "vocab_size": vocab}
    if hidden is not None and hidden != QWEN25_05B["hidden_size"]:
        heads = max(1, hidden // 64)
        shape |= {
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 7),
            "intermediate_size": hidden * 16 // 3 // 64 * 64,
        }
    config = Qwen2Config(
        **shape,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):  # random init where it is fast
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = (
        config.eos_token_id,
        config.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    return {
        "parameters": params,
        "layers": layers,
        "hidden": config.hidden_size,
        "vocab": vocab,
        "tokenizer": "stand-in (tiny-math BPE + <xN>)",
    }


def prompts(n: int) -> list[dict]:
    from areal_nb.data import generate_problems

    return [{"prompt": p["question"]} for p in generate_problems(n, seed=3, split="test")]


def reply_reward(row: dict, reply: str) -> float:
    """Varies between the samples of a group (a random model's replies score nothing on a real task)."""
    return (len(reply) % 7) / 6


# --------------------------------------------------------------------------- stages
def stage_engine(model_dir: Path, device: str, dtype: str) -> dict:

    from areal_nb.api import GenerationConfig, ModelRequest
    from areal_nb.api.saved_tokenizer import load_saved_tokenizer
    from areal_nb.engine import LocalEngine

    tokenizer = load_saved_tokenizer(model_dir)
    engine = LocalEngine(str(model_dir), tokenizer, device=device, dtype=getattr(torch, dtype), seed=0)
    try:
        ids = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=False
            )
            for r in prompts(16)
        ]
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in ids]
        gconfig = GenerationConfig(max_new_tokens=64, temperature=1.0, ignore_eos=True)

        async def run():
            return await asyncio.gather(
                *(engine.agenerate(ModelRequest(input_ids=i, gconfig=gconfig)) for i in ids)
            )

        asyncio.run(run())  # warm-up (allocator, kernels)
        start = time.perf_counter()
        responses = asyncio.run(run())
        seconds = time.perf_counter() - start
        tokens = sum(r.output_len for r in responses)
        return {
            "requests": len(ids),
            "output_tokens": tokens,
            "tok_per_s": round(tokens / seconds, 1),
            "sample": tokenizer.decode(responses[0].output_tokens[:12]),
            "ok": tokens == 64 * len(ids) and all(len(r.output_logprobs) == r.output_len for r in responses),
        }
    finally:
        engine.close()


def session_config(model_dir: Path, device: str, dtype: str, run_dir: Path, extra: list[str]) -> list[str]:
    return [
        f"model.path={model_dir}",
        f"model.dtype={dtype}",
        f"model.device={device}",
        "total_steps=10",
        "rollout.batch_size=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=32",
        "rollout.prefetch=false",
        "actor.lr=1e-6",
        "actor.micro_batch_size=4",
        "logging.progress=false",
        "data.eval_size=4",
        "agent.workflow_kwargs={}",
        f"logging.run_dir={run_dir}",
        *extra,
    ]


def stage_grpo(model_dir: Path, device: str, dtype: str, run_dir: Path, steps: int = 3) -> dict:

    from areal_nb.agents.chat_agent import ChatAgent
    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(
        ROOT / "configs" / "multi_turn_math.yaml", session_config(model_dir, device, dtype, run_dir, [])
    )
    with Session(cfg, dataset=prompts(32), agent__workflow=ChatAgent(reward_fn=reply_reward)) as session:
        params = [p for p in session.actor.model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        per_step = []
        for _ in range(steps):
            stats = session.train_step(session.rollout())
            per_step.append(
                {
                    k: stats.get(k)
                    for k in (
                        "logprob_abs_diff_max",
                        "logprob_abs_diff_mean",
                        "reward_std",
                        "grad_norm",
                        "n_tokens",
                        "train_seconds",
                    )
                }
            )
        changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before, strict=True))
        total = sum(p.numel() for p in params)
        rel = (
            sum(
                float((p.detach().float() - b.float()).norm() ** 2)
                for p, b in zip(params, before, strict=True)
            )
            / sum(float(b.float().norm() ** 2) for b in before)
        ) ** 0.5
        result = {
            "steps": per_step,
            "trainable_dtype": str(params[0].dtype).removeprefix("torch."),
            "compute_dtype": dtype,
            "weights_changed_share": round(changed / total, 4),
            "relative_update": rel,
        }
    diffs = [s["logprob_abs_diff_max"] for s in per_step if s["logprob_abs_diff_max"] is not None]
    # bf16 engine vs trainer kernels: ~1e-2 is the usual gap; far above it the two disagree
    result["ok"] = result["weights_changed_share"] > 0.5 and bool(diffs) and max(diffs) < 0.5
    return result


def stage_fsdp(model_dir: Path, device: str, dtype: str, run_dir: Path) -> dict:
    import torch.distributed as dist

    from areal_nb.api import GenerationConfig
    from areal_nb.config import load_config
    from areal_nb.engine import LocalEngine
    from areal_nb.session.builder import build_actor, build_policy
    from areal_nb.testing import sample_batch
    from areal_nb.train.distributed import DataParallel

    cuda = device.startswith("cuda")
    rank_device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(rank_device)  # NCCL's device for this rank
    if not dist.is_initialized():
        port = _free_port()
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    try:
        cfg = load_config(
            ROOT / "configs" / "multi_turn_math.yaml",
            session_config(model_dir, device, dtype, run_dir, ["actor.parallel=fsdp"]),
        )
        tokenizer, policy = build_policy(cfg)
        actor = build_actor(cfg, policy, parallel=DataParallel(rank=0, world_size=1, device=rank_device))
        engine = LocalEngine(str(model_dir), tokenizer, device=device, dtype=getattr(torch, dtype), seed=0)
        try:
            ids = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in prompts(2)]
            batch, groups = sample_batch(
                engine,
                ids,
                GenerationConfig(max_new_tokens=16, temperature=1.0, ignore_eos=True),
                lambda r: (sum(r.output_tokens) % 5) / 4,
                n_samples=4,
            )
        finally:
            engine.close()
        sharded = [type(p).__name__ for p in actor.model.parameters()]
        stats = actor.train_step(TrainBatch(**batch, group_ids=torch.as_tensor(groups)))
        return {
            "backend": dist.get_backend(),
            "world_size": dist.get_world_size(),
            "dtensor_params": sharded.count("DTensor"),
            "params": len(sharded),
            "loss": stats["loss"],
            "logprob_abs_diff_max": stats.get("logprob_abs_diff_max"),
            "ok": sharded.count("DTensor") == len(sharded) and stats["loss"] == stats["loss"],
        }
    finally:
        dist.destroy_process_group()


def stage_server(model_dir: Path, device: str, work: Path) -> dict:

    from areal_nb.api import GenerationConfig
    from areal_nb.api.saved_tokenizer import load_saved_tokenizer
    from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port
    from areal_nb.engine.remote import SGLangEngine
    from areal_nb.testing import sample_batch

    weights_dir = work / "server-weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    api_key, port = secrets.token_urlsafe(16), free_port()
    cmd = engine_server_command(
        str(model_dir), port=port, api_key=api_key, weights_dir=weights_dir, extra_args=["--device", device]
    )
    server = ServerProcess(cmd, f"http://127.0.0.1:{port}", log_path=work / "engine_server.log").start()
    result: dict = {"command": cmd}
    try:
        server.wait_ready(timeout=240)
        tokenizer = load_saved_tokenizer(model_dir)
        ids = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in prompts(4)]
        gconfig = GenerationConfig(max_new_tokens=16, temperature=1.0, ignore_eos=True)
        with SGLangEngine(
            [server.url], api_key=api_key, weights_dir=weights_dir, config_source=str(model_dir)
        ) as engine:
            start = time.perf_counter()
            batch, _ = sample_batch(engine, ids, gconfig, lambda r: 0.0, n_samples=2)
            result["generate_s"] = round(time.perf_counter() - start, 2)
            result["server_memory_mib"] = _gpu_used_mib() if device.startswith("cuda") else None
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
            with torch.no_grad():
                model.lm_head.weight.mul_(1.01)  # (tied: the embedding too)
            version = engine.get_version() + 1
            start = time.perf_counter()
            engine.update_weights(model.state_dict(), version)
            result["update_weights_s"] = round(time.perf_counter() - start, 2)
            batch2, _ = sample_batch(engine, ids, gconfig, lambda r: 0.0, n_samples=1)
            new_versions = batch2["versions"][batch2["loss_mask"].bool()]
            result["versions"] = [int(batch["versions"].max()), int(new_versions.min())]
            result["ok"] = bool((new_versions == version).all()) and engine.get_version() == version
    finally:
        result["server_exit_code"] = server.stop(grace=20)
    return result


def _free_port() -> int:
    from areal_nb.engine.launcher import free_port

    return free_port()


def _gpu_used_mib() -> list[int] | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return [int(x) for x in out.split()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


# --------------------------------------------------------------------------- SGLang (when installed)
def sglang_contract(
    out: Path, model_dir: Path, port: int, timeout: float, mem_fraction_static: float
) -> dict:
    """The contract tests and the remote GRPO test against a real SGLang server on `model_dir`."""
    import sglang

    from areal_nb.engine.launcher import ServerProcess, free_port, sglang_command

    weights_dir = out / "work" / "sglang-weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    api_key = secrets.token_urlsafe(16)
    port = port or free_port()
    cmd = sglang_command(
        str(model_dir),
        port=port,
        api_key=api_key,
        mem_fraction_static=mem_fraction_static,
        extra_args=["--dtype", "bfloat16", "--random-seed", "0", "--log-level", "info"],
    )
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(cmd, url, log_path=out / "sglang.log").start()
    result: dict = {"server": f"sglang {sglang.__version__}", "command": cmd}
    try:
        server.wait_ready(timeout=timeout)
        env = {
            **os.environ,
            "AREAL_NB_SGLANG_URL": url,
            "AREAL_NB_SGLANG_MODEL": str(model_dir),
            "AREAL_NB_SGLANG_WEIGHTS_DIR": str(weights_dir),
            "AREAL_NB_SGLANG_API_KEY": api_key,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        tests = [
            str(ROOT / "tests/engine/test_server_contract.py"),
            str(ROOT / "tests/engine/test_remote_training.py"),
        ]
        pytest = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-v",
                "-k",
                "sglang",
                "-p",
                "no:cacheprovider",
                f"--junitxml={out / 'junit.xml'}",
                *tests,
            ],
            cwd=ROOT,
            env=env,
            timeout=1800,
            check=False,
        )
        result["pytest_exit_code"] = pytest.returncode
    finally:
        pid = server.pid
        result["server_exit_code"] = server.stop(grace=20)
        try:
            os.killpg(pid, 0)
            result["orphans_left"] = True
        except ProcessLookupError:
            result["orphans_left"] = False
    result["ok"] = result.get("pytest_exit_code") == 0 and not result["orphans_left"]
    return result


# --------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "gpu_check"))
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (the rehearsal)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="model.dtype")
    parser.add_argument("--layers", type=int, default=QWEN25_05B["num_hidden_layers"])
    parser.add_argument("--vocab", type=int, default=QWEN25_05B["vocab_size"])
    parser.add_argument(
        "--hidden", type=int, default=QWEN25_05B["hidden_size"], help="smaller for a rehearsal"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=("engine", "grpo", "fsdp", "server"),
        default=["engine", "grpo", "fsdp", "server"],
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="the rehearsal without a GPU: --device cpu --layers 2 --hidden 128 --vocab 8192",
    )
    parser.add_argument("--sglang", action="store_true", help="also the SGLang contract tests (needs sglang)")
    parser.add_argument("--port", type=int, default=0, help="SGLang's port (0: a free one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for SGLang's /health")
    parser.add_argument("--mem-fraction-static", type=float, default=0.3)
    args = parser.parse_args()
    if args.rehearse:
        args.device, args.layers, args.hidden, args.vocab = "cpu", 2, 128, 8192
    out = Path(args.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    summary: dict = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": args.dtype,
        "stages": {},
    }
    started = time.perf_counter()

    def run(name: str, fn, *a) -> dict:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            result = fn(*a)
        except Exception as exc:  # noqa: BLE001 (a failed stage is reported; the next ones still run)
            result = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
        result["seconds"] = round(time.perf_counter() - t0, 1)
        if cuda:
            result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
            torch.cuda.empty_cache()
        summary["stages"][name] = result
        print("@stage " + json.dumps({"stage": name, **result}, default=str), flush=True)
        return result

    model_dir = work / "model"
    run(
        "model",
        lambda: build_model(model_dir, args.device, args.layers, args.vocab, args.hidden) | {"ok": True},
    )
    if "engine" in args.only:
        run("engine", stage_engine, model_dir, args.device, args.dtype)
    if "grpo" in args.only:
        run("grpo", stage_grpo, model_dir, args.device, args.dtype, out / "run")
    if "fsdp" in args.only:
        run("fsdp", stage_fsdp, model_dir, args.device, args.dtype, out / "run-fsdp")
    if "server" in args.only:
        run("server", stage_server, model_dir, args.device, work)
    if args.sglang:
        run("sglang", sglang_contract, out, model_dir, args.port, args.timeout, args.mem_fraction_static)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["peak_gpu_mib"] = max(
        (s.get("peak_gpu_mib", 0) for s in summary["stages"].values()), default=None
    )
    summary["ok"] = all(s.get("ok") for s in summary["stages"].values())
    for s in summary["stages"].values():
        s.pop("traceback", None)
    print(json.dumps(summary, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
