"""Hand the heap memory a train step freed back to the operating system (glibc's `malloc_trim`).

On CPU, torch allocates tensors with the C library's malloc. A train step allocates and frees
gigabytes of activations, logits and gradients of sizes that change with every batch; glibc keeps
what is freed inside its heaps (one per thread that allocates: the trainer's, the embedded
engine's worker, the agents' loop) for reuse, and the next step's differently sized tensors fit
those holes only in part. The process's resident memory then climbs for several steps after the
tensors it holds stopped growing. `malloc_trim(0)` releases every whole free page of every heap
(madvise), so a Session's memory follows what it holds. On other C libraries (musl, macOS) there
is nothing to call and nothing is done; on CUDA the caching allocator keeps device memory by
design, and this touches host memory only.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> bool:
    """Return the heaps' free pages to the OS; False where the C library has no `malloc_trim`."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
