"""`areal-nb proxy`: the proxy with the embedded engine, standalone, for agents elsewhere.

    areal-nb proxy --model tiny-math --host 127.0.0.1 --port 8000 --admin-key SECRET

Prints `areal-nb proxy listening on URL` once it accepts connections and stops cleanly on
SIGINT or SIGTERM (server first, then the engine).
"""

from __future__ import annotations

import argparse
import sys

from areal_nb.api import CHAT_TEMPLATE_TYPES
from areal_nb.cli import server_parser
from areal_nb.proxy.settings import (
    DEFAULT_ADMIN_API_KEY,
    DEFAULT_SESSION_TIMEOUT,
    ProxySettings,
    validate_admin_key,
)


def build_parser() -> argparse.ArgumentParser:
    parser = server_parser("areal-nb proxy", __doc__ or "", 8000)
    parser.add_argument(
        "--admin-key", default=DEFAULT_ADMIN_API_KEY, help="refused as default on non-loopback hosts"
    )
    parser.add_argument("--chat-template-type", choices=CHAT_TEMPLATE_TYPES, default="hf")
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=DEFAULT_SESSION_TIMEOUT,
        help="seconds without calls before a session is dropped",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--engine-max-tokens", type=int, default=None, help="cap on prompt + output tokens")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        validate_admin_key(args.admin_key, args.host)
        settings = ProxySettings(
            admin_api_key=args.admin_key, session_timeout=args.session_timeout, model_name=args.model
        )
    except ValueError as exc:
        print(f"areal-nb proxy: {exc}", file=sys.stderr)
        return 2

    from areal_nb.capture.completion import CompletionSettings
    from areal_nb.cli.serving import serve_until_signal
    from areal_nb.engine import LocalEngine
    from areal_nb.models import load_tokenizer, resolve_model_path
    from areal_nb.proxy import ProxyServer, create_app

    settings.completion = CompletionSettings(
        chat_template_type=args.chat_template_type, engine_max_tokens=args.engine_max_tokens
    )
    tokenizer = load_tokenizer(args.model)
    engine = LocalEngine(resolve_model_path(args.model), tokenizer, device=args.device)
    server = ProxyServer(create_app(engine, tokenizer, settings), host=args.host, port=args.port)
    return serve_until_signal(server, engine, "proxy", args.model)


if __name__ == "__main__":
    raise SystemExit(main())
