"""A child process that answers questions with SGLang's own functions (see sglang_wheel.py).

    python sglang_checker.py UNPACKED_WHEEL_DIR       then one JSON question per line on stdin

Each question is `{"op": ..., ...}`; each answer one JSON line, `{"error": null}` when SGLang
accepts, else its error text:
- `server_args` (`argv`): `sglang.srt.server_args.prepare_server_args`, what `launch_server` runs
  on its command line, then (LoRA enabled) `arg_groups.lora_hook.check_lora_server_args`, the
  LoRA part of its launch-time validation; the answer also carries the parsed values of the flags
  we set.
- `generate` (`body`, `vocab_size`): the HTTP server's schema gate
  (`sglang.srt.entrypoints.api_contract.generate_contract_error`), then, per prompt, the scheduler's
  checks: `SamplingParams(**sampling_params)`, `.normalize(None)`, `.verify(vocab_size)`.
- `abort` (`body`): the API schema's `AbortRequest` decoder (`sglang.api.v1.api_types`).
- `error_body` (`body`): the API types' `GenerateStreamError` decoder, with an `ErrorBody` that has
  a message.
- `lora_request` (`route`, `body`): what the HTTP server's `/load_lora_adapter` and
  `/unload_lora_adapter` routes decode their body into (`LoadLoRAAdapterReqInput`,
  `UnloadLoRAAdapterReqInput`, through pydantic, as FastAPI does).
- `lora_reply` (`body`): the body those routes answer, `LoRAUpdateOutput` as builtins: the reply
  must build one with exactly its fields and equal what SGLang would write for it.

`io_struct.py`, where the LoRA request and reply types live, imports the scheduler's modules and
with them torchvision, which this environment does not have. The four classes needed (`BaseReq`
and the three above) are taken from its source unchanged (their class statements, executed after
the file's own imports that do import), not rewritten.

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


def io_struct_classes(site: str, names: tuple[str, ...]) -> dict:
    """The class statements `names` of sglang's io_struct.py, executed after the file's imports."""
    import ast
    import types

    tree = ast.parse(open(f"{site}/sglang/srt/managers/io_struct.py").read())
    module = types.ModuleType("sglang_io_struct_classes")  # msgspec resolves annotations through it
    sys.modules[module.__name__] = module
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            try:
                exec(compile(ast.Module([node], []), "io_struct.py", "exec"), module.__dict__)
            except Exception:  # noqa: BLE001 - the scheduler's imports (torchvision); the classes need none
                pass
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names]
    assert {c.name for c in classes} == set(names), f"io_struct.py no longer defines {names}"
    exec(compile(ast.Module(classes, []), "io_struct.py", "exec"), module.__dict__)
    return {name: module.__dict__[name] for name in names}


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
        if args.enable_lora:
            from sglang.srt.arg_groups.lora_hook import check_lora_server_args

            try:
                check_lora_server_args(args)
            except (AssertionError, ValueError) as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}
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
            "enable_lora",
            "max_lora_rank",
            "lora_target_modules",
            "max_loras_per_batch",
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

    lora_types = {}

    def lora_type(name: str):
        if not lora_types:
            lora_types.update(
                io_struct_classes(
                    site,
                    ("BaseReq", "LoadLoRAAdapterReqInput", "UnloadLoRAAdapterReqInput", "LoRAUpdateOutput"),
                )
            )
        return lora_types[name]

    def lora_request(q):
        import pydantic

        name = {
            "/load_lora_adapter": "LoadLoRAAdapterReqInput",
            "/unload_lora_adapter": "UnloadLoRAAdapterReqInput",
        }
        try:
            decoded = pydantic.TypeAdapter(lora_type(name[q["route"]])).validate_json(json.dumps(q["body"]))
        except pydantic.ValidationError as exc:
            return {"error": str(exc)}
        return {"error": None, "lora_name": decoded.lora_name}

    def lora_reply(q):
        from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

        body = dict(q["body"])
        try:
            rebuilt = msgspec_to_builtins(lora_type("LoRAUpdateOutput")(**body))
        except TypeError as exc:
            return {"error": f"not a LoRAUpdateOutput: {exc}"}
        if rebuilt != body:
            return {"error": f"SGLang writes {rebuilt}, got {body}"}
        return {"error": None}

    ops = {
        "server_args": server_args,
        "generate": generate,
        "abort": abort,
        "error_body": error_body,
        "lora_request": lora_request,
        "lora_reply": lora_reply,
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
