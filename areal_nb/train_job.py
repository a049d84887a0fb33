"""`areal-nb train --config FILE key=value ...`: the same training as the notebook, as a batch job."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="areal-nb train", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.lr=1e-5 total_steps=5")
    args = parser.parse_args(argv)

    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(args.config, args.overrides)
    run_dir = Path(cfg.logging.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with Session(cfg) as session:
        history = session.run(cfg.total_steps)
        accuracy = session.evaluate()
        session.save(run_dir / "final")
    history.to_csv(run_dir / "history.csv", index=False)
    (run_dir / "final_eval.json").write_text(json.dumps({"eval_accuracy": accuracy}))
    print(f"done: {len(history)} steps, held-out accuracy {accuracy:.3f}; wrote {run_dir}")
    return 0
