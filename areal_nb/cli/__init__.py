"""The `areal-nb` command: `demo` (the main job), `proxy` (standalone proxy server),
`train` (a batch run from a YAML config), `engine-server`, `export` (a run folder for a batch job),
`export-model` (a checkpoint's policy as a Hugging Face folder).

The top layer, beside the Session: a command may wire any package together (`cli/proxy.py`
builds an engine from a model name and serves it through the proxy).
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from areal_nb.demo import main as demo_main

        return demo_main(rest) or 0
    if command == "proxy":
        from areal_nb.cli.proxy import main as proxy_main

        return proxy_main(rest) or 0
    if command == "train":
        from areal_nb.train_job import main as train_main

        return train_main(rest) or 0
    if command == "engine-server":
        from areal_nb.cli.engine_server import main as engine_server_main

        return engine_server_main(rest) or 0
    if command == "export":
        from areal_nb.cli.export import main as export_main

        return export_main(rest) or 0
    if command == "export-model":
        from areal_nb.cli.export_model import main as export_model_main

        return export_model_main(rest) or 0
    if command == "build-models":
        from areal_nb.cli.build_models import main as build_models_main

        return build_models_main(rest) or 0
    print(f"areal-nb: unknown command {command!r}\n\n{_USAGE}", file=sys.stderr)
    return 2
