"""A child process that answers questions with SGLang's own functions (see sglang_wheel.py).

    python sglang_checker.py UNPACKED_WHEEL_DIR       then one JSON question per line on stdin

Each question is `{"op": ..., ...}`; each answer one JSON line, `{"error": null}` when SGLang
accepts, else its error text:
- `server_args` (`argv`): `sglang.srt.server_args.prepare_server_args`, what `launch_server` runs
  on its command line; the answer also carries the parsed values of the flags we set.
- `generate` (`body`, `vocab_size`): the HTTP server's schema gate
  (`sglang.srt.entrypoints.api_contract.generate_contract_error`), then, per prompt, the scheduler's
  checks: `SamplingParams(**sampling_params)`, `.normalize(None)`, `.verify(vocab_size)`.
- `abort` (`body`): the API schema's `AbortRequest` decoder (`sglang.api.v1.api_types`).
- `error_body` (`body`): the API types' `GenerateStreamError` decoder, with an `ErrorBody` that has
  a message.

Import stubs. SGLang imports `triton` at module level (server_args → ... → its kernels); triton
exists only with CUDA. It is stubbed with SGLang's own `_platform_stubs.install_platform_stubs`
(written for macOS/MPS, where triton is missing too), run here as on an arm64 Mac with MPS: its
meta-path finder answers every `import triton...` with a mock module, and `torch.mps` gets its
stand-ins (this process never computes anything). Nothing else is stubbed: `msgspec` and `pybase64`
are real packages of the `test` extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import platform
import sys


class _Tokenizer:
    """What `SamplingParams.normalize` asks of a tokenizer: a stop string's length in tokens (one
    per character here; only the longest stop's length is kept, to size a detokenizer window)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text)))


def install_stubs(site: str) -> None:
    import torch

    spec = importlib.util.spec_from_file_location(
        "_sglang_platform_stubs", f"{site}/sglang/_platform_stubs.py"
    )
    stubs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = stubs  # dataclasses look their module up while the file runs
    spec.loader.exec_module(stubs)
    saved = sys.platform, platform.machine, torch.backends.mps.is_available
    sys.platform, platform.machine, torch.backends.mps.is_available = "darwin", lambda: "arm64", lambda: True
    try:
        stubs.install_platform_stubs()
    finally:
        sys.platform, platform.machine, torch.backends.mps.is_available = saved


def main(site: str) -> None:
    # answers go to the original stdout; anything SGLang prints goes to stderr
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, site)
    install_stubs(site)
    from sglang.api.v1.api_types import AbortRequest, GenerateStreamError, JsonContractError
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import prepare_server_args
    from sglang.version import __version__

    def server_args(q):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(list(q["argv"]))
        except SystemExit:
            lines = err.getvalue().strip().splitlines()  # argparse: the usage, then "prog: error: ..."
            return {"error": lines[-1] if lines else "argparse exited"}
        keys = (
            "model_path",
            "host",
            "port",
            "tp_size",
            "dp_size",
            "api_key",
            "weight_version",
            "max_running_requests",
            "mem_fraction_static",
            "dtype",
            "base_gpu_id",
            "random_seed",
        )
        return {"error": None, "args": {k: getattr(args, k, None) for k in keys}}

    def generate(q):
        body = q["body"]
        error = generate_contract_error(body)
        if error is not None:
            return {"error": error}
        params = body.get("sampling_params") or {}
        for one in params if isinstance(params, list) else [params]:
            try:
                sampling = SamplingParams(**one)
                sampling.normalize(_Tokenizer())
                sampling.verify(q["vocab_size"])
            except (ValueError, TypeError) as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}
        return {"error": None}

    def abort(q):
        try:
            AbortRequest.from_json_value(q["body"])
        except JsonContractError as exc:
            return {"error": str(exc)}
        return {"error": None}

    def error_body(q):
        try:
            decoded = GenerateStreamError.from_json_value(q["body"])
        except JsonContractError as exc:
            return {"error": str(exc)}
        if decoded.error is None or not decoded.error.message:
            return {"error": "no error.message"}
        return {"error": None, "message": decoded.error.message, "code": decoded.error.code}

    ops = {
        "server_args": server_args,
        "generate": generate,
        "abort": abort,
        "error_body": error_body,
        "version": lambda q: {"error": None, "version": __version__},
    }
    print(json.dumps({"ready": __version__}), file=answers, flush=True)
    for line in sys.stdin:
        question = json.loads(line)
        try:
            answer = ops[question["op"]](question)
        except Exception as exc:  # noqa: BLE001 - the test reads it as a failure of the check itself
            answer = {"error": f"checker failed: {type(exc).__name__}: {exc}", "crashed": True}
        print(json.dumps(answer, default=str), file=answers, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
