"""Rank 0 stalls (a hung rollout, say) while rank 1 waits for its next message: rank 1 must give up
after the process-group timeout (AREAL_NB_DIST_TIMEOUT_S) instead of waiting forever.
Run by tests/train/test_distributed.py under torchrun."""

import time

from areal_nb.train.distributed import init_from_env

parallel = init_from_env()
assert parallel is not None
if parallel.rank == 0:
    time.sleep(120)  # torchrun ends this rank when rank 1 fails
else:
    parallel.broadcast(None)
