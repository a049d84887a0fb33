"""The `areal-nb` command: `demo` (the main job), `proxy` (standalone proxy server),
`train` (a batch run from a YAML config), `engine-server`, `export` (a run folder for a batch job),
`export-model` (a checkpoint's policy as a Hugging Face folder).

The top layer, beside the Session: a command may wire any package together (`cli/proxy.py`
builds an engine from a model name and serves it through the proxy).
"""

from __future__ import annotations

import argparse
import importlib
import sys

_USAGE = """usage: areal-nb <command> [options]

commands:
  demo     train the multi-turn math agent on the built-in tiny model (the main job)
  proxy    serve the OpenAI/Anthropic-compatible proxy with the embedded engine
  train    run GRPO training from a YAML config (areal-nb train --config FILE key=value ...)
  engine-server  serve the embedded engine over SGLang's native HTTP API
  export   write a run folder (config, train.py, launch_local.sh, job.sbatch) from a YAML config
           (areal-nb export --out DIR CONFIG key=value ...)
  export-model  write a Session checkpoint's policy as a Hugging Face folder
           (areal-nb export-model CHECKPOINT DIR)
  build-models  rebuild the shipped built-in models from their recipe (areal-nb build-models --help)
"""

# Each command's module, whose main(argv) runs it.
_COMMANDS = {
    "demo": "areal_nb.demo",
    "proxy": "areal_nb.cli.proxy",
    "train": "areal_nb.train_job",
    "engine-server": "areal_nb.cli.engine_server",
    "export": "areal_nb.cli.export",
    "export-model": "areal_nb.cli.export_model",
    "build-models": "areal_nb.cli.build_models",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command in _COMMANDS:  # imported on use: `areal-nb proxy` loads no training code
        return importlib.import_module(_COMMANDS[command]).main(rest) or 0
    print(f"areal-nb: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr)
    return 2


def server_parser(prog: str, doc: str, port: int) -> argparse.ArgumentParser:
    """A server command's parser, with the flags every server takes (`--model`, `--host`, `--port`)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    parser.add_argument("--model", default="tiny-math", help="model name or path (default: tiny-math)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port, help="0 picks a free port")
    return parser
