"""`areal-nb export-model RUN_OR_CHECKPOINT DIR`: a `Session.save` checkpoint's policy (or a run
folder's latest checkpoint) as a Hugging Face folder (`session.save_pretrained(DIR)` without a
notebook): weights in the run's `model.dtype`, config, generation config and tokenizer, which
`transformers.AutoModelForCausalLM.from_pretrained` loads. `--adapter`: a LoRA run's adapter
alone, which `peft.PeftModel.from_pretrained(base, DIR)` loads on its base. `--agent NAME`: a run
that trains one adapter per agent (`agents`) exports that agent's policy.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="areal-nb export-model", description=__doc__.split("\n")[0])
    parser.add_argument(
        "checkpoint",
        metavar="RUN_OR_CHECKPOINT",
        help="a folder written by Session.save (or checkpoint.save_every), or a run folder: its latest checkpoint",
    )
    parser.add_argument("out", help="the Hugging Face folder to write")
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA runs: write the adapter alone (for peft), not merged weights",
    )
    parser.add_argument(
        "--agent",
        metavar="NAME",
        help="runs with one adapter per agent (the agents config): the agent whose policy to write",
    )
    args = parser.parse_args(argv)

    from areal_nb.config import ConfigError
    from areal_nb.errors import CheckpointError
    from areal_nb.session.hf_export import export_checkpoint, find_checkpoint

    try:
        checkpoint = find_checkpoint(args.checkpoint)
        out = export_checkpoint(checkpoint, args.out, merged=not args.adapter, agent=args.agent)
    except (FileNotFoundError, ConfigError, CheckpointError, ValueError) as exc:
        print(f"areal-nb export-model: {exc}", file=sys.stderr)
        return 2
    loader = (
        "PeftModel.from_pretrained(base, {!r})"
        if args.adapter
        else "AutoModelForCausalLM.from_pretrained({!r})"
    )
    print(f"wrote {out} from {checkpoint}: {loader.format(str(out))}")
    return 0
