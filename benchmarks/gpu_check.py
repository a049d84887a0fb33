"""The SGLang device check (run by `benchmarks/gpu_check.sh` on a GPU machine with sglang installed).

1. builds a small public-architecture model from scratch: a Qwen2 config (head_dim 64), random
   init, bf16, saved with `save_pretrained` beside the tiny-math tokenizer — nothing from the hub;
2. launches a real SGLang server on it with our launcher (`python -m sglang.launch_server`, own
   process group, health wait, log to OUT/sglang.log);
3. runs the contract test module and the GRPO-step test against it (`-k sglang`: only the
   parametrization that talks to that server), with the JUnit report in OUT;
4. stops the server (SIGTERM, then SIGKILL of the group) and checks no process of it is left.

    python benchmarks/gpu_check.py --out DIR [--port 30000] [--timeout 600]
    python benchmarks/gpu_check.py --rehearse   # the same steps with `areal-nb engine-server` (CPU)

Prints one JSON line at the end: sglang/torch versions, pytest's exit code and counts.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_model(folder: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from areal_nb.models import load_tokenizer

    tokenizer = load_tokenizer("tiny-math")  # built locally from generated text in well under a second
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=256, num_attention_heads=4, num_key_value_heads=2,  # head_dim 64
        intermediate_size=704, num_hidden_layers=4, max_position_embeddings=32768, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "gpu_check"))
    parser.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    parser.add_argument("--mem-fraction-static", type=float, default=0.3)
    parser.add_argument("--rehearse", action="store_true",
                        help="serve with areal-nb engine-server instead of sglang (checks this script without a GPU)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port, sglang_command

    work = out / "work"
    model_dir = build_model(work / "model")
    weights_dir = work / "weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    api_key = secrets.token_urlsafe(16)
    port = args.port or free_port()
    if args.rehearse:
        cmd = engine_server_command(str(model_dir), port=port, api_key=api_key, weights_dir=weights_dir)
        served_by = "areal-nb engine-server (rehearsal)"
    else:
        import sglang

        cmd = sglang_command(str(model_dir), port=port, api_key=api_key,
                             mem_fraction_static=args.mem_fraction_static,
                             extra_args=["--dtype", "bfloat16", "--random-seed", "0", "--log-level", "info"])
        served_by = f"sglang {sglang.__version__}"
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(cmd, url, log_path=out / "sglang.log").start()
    started = time.perf_counter()
    result: dict = {"server": served_by, "torch": torch.__version__, "cuda": torch.version.cuda,
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "command": cmd}
    try:
        server.wait_ready(timeout=args.timeout)
        result["server_ready_s"] = round(time.perf_counter() - started, 1)
        env = {**os.environ, "AREAL_NB_SGLANG_URL": url, "AREAL_NB_SGLANG_MODEL": str(model_dir),
               "AREAL_NB_SGLANG_WEIGHTS_DIR": str(weights_dir), "AREAL_NB_SGLANG_API_KEY": api_key,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        tests = [str(ROOT / "tests/engine/test_server_contract.py"), str(ROOT / "tests/engine/test_remote_training.py")]
        pytest = subprocess.run(
            [sys.executable, "-m", "pytest", "-v", "-k", "sglang", "-p", "no:cacheprovider",
             f"--junitxml={out / 'junit.xml'}", *tests],
            cwd=ROOT, env=env, timeout=1800,
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
    print(json.dumps(result))
    return 0 if result.get("pytest_exit_code") == 0 and not result["orphans_left"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
