"""`areal-nb train --config FILE key=value ...`: the same training as the notebook, as a batch job
(`torchrun --nproc-per-node N -m areal_nb.cli train ...`: data-parallel on N ranks)."""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="areal-nb train", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.lr=1e-5 total_steps=5")
    args = parser.parse_args(argv)

    from areal_nb.config import load_config
    from areal_nb.session import Session

    cfg = load_config(args.config, args.overrides)
    run_dir = cfg.run_dir  # logging.run_dir, or runs/<experiment_name>
    # Under torchrun every rank runs this: rank 0 rolls out, evaluates and writes; the others
    # train their share of each batch (docs/guides/data-parallel.md).
    with Session(cfg) as session:
        if session.rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
        history = session.run(cfg.total_steps)
        result = session.evaluate()
        session.save(run_dir / "final")
        if session.rank != 0:
            return 0
    history.to_csv(run_dir / "history.csv", index=False)
    figures = {
        "experiment_name": cfg.experiment_name,
        "n": result.n,
        "rejected": result.rejected,
        **result.as_dict(),
    }
    (run_dir / "final_eval.json").write_text(json.dumps(figures, indent=2))
    print(
        f"done: {cfg.experiment_name}, {len(history)} steps; held-out greedy reward {result.reward_mean:.3f}, "
        f"accuracy {result.accuracy:.3f} (first reply), {result.agent_accuracy:.3f} (agent's turns); wrote {run_dir}"
    )
    return 0
