"""`areal-nb engine-server`: the embedded engine behind SGLang's native HTTP API subset.

    areal-nb engine-server --model tiny-math --host 127.0.0.1 --port 30000 \\
        --api-key KEY --weights-dir /shared/weights

What CPU machines, CI and the cluster export's CPU path run where a GPU machine runs
`python -m sglang.launch_server`; the `SGLangEngine` client talks to both the same way.
An API key is required off loopback (clients send `Authorization: Bearer KEY`): give it with
`--api-key-file FILE` or the `AREAL_NB_API_KEY` environment variable rather than `--api-key`,
whose value every user of the machine can read in `ps`;
`/update_weights_from_disk` reads only directories under `--weights-dir`. Prints
`areal-nb engine-server listening on URL` once it accepts connections; stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_nb.cli import server_parser
from areal_nb.engine.admission import DEFAULT_ADMISSION_GAP, DEFAULT_ADMISSION_MAX_WAIT
from areal_nb.engine.defaults import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PREFIX_CACHE_TOKENS,
    DEFAULT_SERVER_SINGLE_THREAD_ROWS,
)
from areal_nb.engine.factory import API_KEY_ENV  # the key's environment variable, shared with the client
from areal_nb.engine.lora_flags import (
    DEFAULT_MAX_LORAS_PER_BATCH,
    SGLANG_LORA_TARGET_MODULES,
    LoraSettings,
    parse_lora_paths,
)
from areal_nb.errors import InvalidArgumentError, ModelFileError

if TYPE_CHECKING:
    import torch

# The engine's worker thread and the HTTP thread share the GIL: every torch op releases it, every
# socket call of the HTTP thread does too, and a thread that wants it back while the other runs
# Python may wait a whole switch interval before Python forces the hand-over. Shorter intervals
# (1, 0.5, 0.2, 0.1 ms) measured no steadier win on the 2-core development machine (0.1 ms split
# bursts into more prefills: the engine thread grabbed the GIL between arrivals), so the default
# stays Python's; the flag is there to measure it on other machines.
_DEFAULT_SWITCH_INTERVAL = 0.005


# SGLang's `--dtype` names (its "auto" casts float32 checkpoints to float16 on GPUs; here "auto"
# keeps the saved dtype: float16 matmuls are slow on CPUs, where this server mostly runs)
_SERVING_DTYPES = {
    "auto": None,
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}


def serving_dtype(name: str, model_path: str) -> torch.dtype:
    """The torch dtype `--dtype name` serves the model at `model_path` (a folder or a Hugging Face
    id) in; "auto" reads the dtype its config was saved with."""
    import torch

    chosen = _SERVING_DTYPES[name]
    if chosen is not None:
        return getattr(torch, chosen)
    from transformers import AutoConfig

    try:
        saved = AutoConfig.from_pretrained(model_path).dtype  # `dtype` or the older `torch_dtype`
    except (AttributeError, OSError, ValueError) as exc:  # AttributeError: a dtype torch lacks
        raise ModelFileError(f"the saved dtype of {model_path} cannot be read: {exc}") from exc
    return saved if isinstance(saved, torch.dtype) else torch.float32


# The flags passed on as they are, by their own names: `LocalEngine`'s keywords and
# `EngineServerSettings`' fields (a test checks that each name is both a flag and a keyword).
ENGINE_FLAGS = ("device", "max_batch_size", "seed", "prefix_cache_tokens", "single_thread_rows")
SETTINGS_FLAGS = ("weights_dir", "admission_gap", "admission_max_wait", "max_body_bytes", "body_timeout")


def flags_named(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names}


# One declaration list, flag by flag as `--help` shows them: splitting it would only scatter them.
def build_parser() -> argparse.ArgumentParser:
    parser = server_parser("areal-nb engine-server", __doc__ or "", 30000)
    parser.add_argument(
        "--api-key",
        default=None,
        help="required when --host is not a loopback address; visible in `ps`, so prefer "
        f"--api-key-file or the {API_KEY_ENV} environment variable",
    )
    parser.add_argument(
        "--api-key-file", default=None, help="a file holding the API key (surrounding whitespace ignored)"
    )
    parser.add_argument("--weights-dir", default=None, help="the only directory weight updates may load from")
    parser.add_argument("--weight-version", type=int, default=0, help="version of the initial weights")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=sorted(_SERVING_DTYPES),
        help="the dtype the model is served in (SGLang's names; auto: the checkpoint's saved dtype, "
        "float32 when it names none)",
    )
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=DEFAULT_PREFIX_CACHE_TOKENS,
        help="tokens of finished sequences' KV kept for prompts that continue them (0: off)",
    )
    parser.add_argument(
        "--single-thread-rows",
        type=int,
        default=DEFAULT_SERVER_SINGLE_THREAD_ROWS,
        help="CPU: decoding steps of at most this many rows run on one torch thread "
        "(0: every step on torch's threads, right for a server alone on its "
        "machine; default: %(default)s)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch's intra-op threads (default: torch's, one per core); give each of "
        "several servers sharing a machine its share of the cores",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=_DEFAULT_SWITCH_INTERVAL,
        help="this process's sys.setswitchinterval, in seconds (default: %(default)s; "
        "Python's own is 0.005): how long the engine thread or the HTTP thread may "
        "wait for the other to hand over the GIL",
    )
    parser.add_argument(
        "--admission-gap",
        type=float,
        default=DEFAULT_ADMISSION_GAP,
        help="seconds a burst of requests reaching an idle engine may pause before it "
        "starts as one batch (default: %(default)s; 0: each request starts at once)",
    )
    parser.add_argument(
        "--admission-max-wait",
        type=float,
        default=DEFAULT_ADMISSION_MAX_WAIT,
        help="the longest a request waits for its burst to end, in seconds",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger request bodies are refused with 413 before they are parsed",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        help="seconds a request body may take to arrive after its headers (408 after that)",
    )
    lora = parser.add_argument_group("LoRA adapters (SGLang's flags; docs/guides/lora-and-export.md)")
    lora.add_argument(
        "--enable-lora",
        action="store_true",
        default=None,
        help="serve LoRA adapters: /load_lora_adapter, /unload_lora_adapter, lora_path on /generate "
        "(implied by --lora-paths)",
    )
    lora.add_argument("--max-lora-rank", type=int, default=None, help="the largest adapter rank loaded")
    lora.add_argument(
        "--lora-target-modules",
        nargs="*",
        default=None,
        choices=SGLANG_LORA_TARGET_MODULES,
        help="the modules adapters may adapt ('all': any)",
    )
    lora.add_argument(
        "--max-loras-per-batch",
        type=int,
        default=DEFAULT_MAX_LORAS_PER_BATCH,
        help="accepted as SGLang's; this server runs one adapter (or the base) at a time",
    )
    lora.add_argument(
        "--lora-paths",
        nargs="*",
        default=None,
        help="adapters loaded at start: PATH, NAME=PATH or JSON {lora_name, lora_path}",
    )
    return parser


def lora_settings(args: argparse.Namespace) -> LoraSettings | None:
    """The LoRA flags as SGLang resolves them (ValueError with its message), None if LoRA is off."""
    if not (args.enable_lora or (args.enable_lora is None and args.lora_paths)):
        return None
    return LoraSettings(
        max_lora_rank=args.max_lora_rank,
        target_modules=args.lora_target_modules,
        max_loras_per_batch=args.max_loras_per_batch,
        lora_paths=parse_lora_paths(args.lora_paths or []),
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _api_key_of(args: argparse.Namespace) -> str | None:
    """--api-key, else the contents of --api-key-file, else $AREAL_NB_API_KEY, else None."""
    if args.api_key and args.api_key_file:
        raise InvalidArgumentError("give --api-key or --api-key-file, not both")
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read --api-key-file: {exc}") from exc
        if not key:
            raise InvalidArgumentError(f"--api-key-file {args.api_key_file} is empty")
        return key
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def _checked_api_key(args: argparse.Namespace) -> str | None:
    """The API key (`_api_key_of`); InvalidArgumentError when there is none off loopback."""
    api_key = _api_key_of(args)
    if not api_key and not is_loopback(args.host):
        raise InvalidArgumentError(
            f"an API key is required to listen on {args.host} (not loopback): "
            f"--api-key-file FILE, ${API_KEY_ENV} or --api-key"
        )
    return api_key


def _apply_process_flags(args: argparse.Namespace) -> None:
    """Check the flags that tune this process and set them (InvalidArgumentError on a bad one)."""
    if args.single_thread_rows < 0:
        raise InvalidArgumentError(f"--single-thread-rows must be >= 0, got {args.single_thread_rows}")
    if args.switch_interval <= 0:
        raise InvalidArgumentError(f"--switch-interval must be > 0, got {args.switch_interval}")
    sys.setswitchinterval(args.switch_interval)  # our own process: a process-wide setting is fine here
    if args.torch_threads is not None:
        if args.torch_threads < 1:
            raise InvalidArgumentError(f"--torch-threads must be >= 1, got {args.torch_threads}")
        import torch

        torch.set_num_threads(args.torch_threads)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api_key = _checked_api_key(args)
        _apply_process_flags(args)
        lora = lora_settings(args)
    except ValueError as exc:
        print(f"areal-nb engine-server: {exc}", file=sys.stderr)
        return 2

    from areal_nb.cli.serving import serve_until_signal
    from areal_nb.engine import LocalEngine
    from areal_nb.engine.server import EngineServerSettings, create_engine_app
    from areal_nb.models import load_tokenizer, resolve_model_path
    from areal_nb.proxy.server import ProxyServer  # a plain uvicorn-in-a-thread runner

    model_path = resolve_model_path(args.model)
    try:
        dtype = serving_dtype(args.dtype, str(model_path))
    except ValueError as exc:
        print(f"areal-nb engine-server: --dtype {args.dtype}: {exc}", file=sys.stderr)
        return 2
    engine = LocalEngine(
        model_path, load_tokenizer(args.model), dtype=dtype, **flags_named(args, ENGINE_FLAGS)
    )
    engine.set_version(args.weight_version)
    settings = EngineServerSettings(
        model_path=str(model_path),
        served_model_name=args.model,
        api_key=api_key,
        lora=lora,
        **flags_named(args, SETTINGS_FLAGS),
    )
    try:
        app = create_engine_app(engine, settings)
    except ValueError as exc:  # an adapter of --lora-paths that does not load
        engine.close()
        print(f"areal-nb engine-server: --lora-paths: {exc}", file=sys.stderr)
        return 2
    server = ProxyServer(app, host=args.host, port=args.port)
    served = f"{args.model}, {str(dtype).removeprefix('torch.')}"
    return serve_until_signal(server, engine, "engine-server", served)


if __name__ == "__main__":
    raise SystemExit(main())
