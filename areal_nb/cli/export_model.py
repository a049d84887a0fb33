"""`areal-nb export-model CHECKPOINT DIR`: a `Session.save` checkpoint's policy as a Hugging Face
folder (`session.save_pretrained(DIR)` without a notebook): weights in the run's `model.dtype`,
config, generation config and tokenizer, which `transformers.AutoModelForCausalLM.from_pretrained`
loads.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="areal-nb export-model", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a folder written by Session.save (or checkpoint.every_steps)")
    parser.add_argument("out", help="the Hugging Face folder to write")
    args = parser.parse_args(argv)

    from areal_nb.config import ConfigError
    from areal_nb.session.hf_export import export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.out)
    except (FileNotFoundError, ConfigError) as exc:
        print(f"areal-nb export-model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0
