"""How ranks end under torchrun: `python -m torch.distributed.run --nproc-per-node 2
tests/train/ddp_exit.py OUT MODE`. Each rank writes `end-<rank>` when its program reaches its
end and `exit-<rank>` from its last exit handler (after the process group is gone).

MODE "late": rank 0 reaches its end 2 s after rank 1. MODE "fail": rank 1 raises at once while
rank 0 sleeps 5 s. Used by tests/train/test_distributed.py."""

from __future__ import annotations

import atexit
import sys
import time
from pathlib import Path

from areal_nb.train.distributed import init_from_env


def main(out: Path, mode: str) -> None:
    rank_box: list[int] = []
    # registered before the process group's own exit handler, so it runs after it
    atexit.register(lambda: (out / f"exit-{rank_box[0]}").write_text(repr(time.time())) if rank_box else None)
    parallel = init_from_env(timeout_s=60)
    assert parallel is not None, "run under torchrun (WORLD_SIZE > 1)"
    rank_box.append(parallel.rank)
    if mode == "late" and parallel.rank == 0:
        time.sleep(2)
    if mode == "fail":
        if parallel.rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(5)
    (out / f"end-{parallel.rank}").write_text(repr(time.time()))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
