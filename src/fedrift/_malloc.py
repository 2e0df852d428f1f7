"""glibc malloc settings that keep a training process's freed activations for its next step.

By default glibc hands large freed blocks back to the kernel (``munmap``, or trimming the
heap's free top past 128 KiB), and the next step faults the same memory in again, page by
page. A ResNet-8 step on 64x64 images allocates and frees activations of 8-32 MiB: a round of
R3 at 64 spent 40 of 153 CPU seconds in the kernel that way (``benchmarks/malloc_cost.py``,
BENCHMARKS.md "Freed memory kept"). Serving blocks up to 32 MiB (glibc's largest mmap
threshold) from the heap and keeping up to 1 GiB of its free top removes most of it. The peak
memory does not grow: only memory the process already used is kept.

Set in every process that imports fedrift (the command line, ``import fedrift``, the
``processes`` executor's workers, Ray's actors), on glibc only. Not set where the user set
glibc's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` (theirs apply), or with
``FEDRIFT_MALLOC=default`` (glibc's defaults).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the largest glibc allows: blocks up to it come from the heap
TRIM_THRESHOLD = 1 << 30  # the heap's free top kept before it goes back to the kernel


def keep_freed_memory() -> bool:
    """Apply the settings to this process; True when they were applied."""
    if not sys.platform.startswith("linux") or os.environ.get("FEDRIFT_MALLOC") == "default":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library symbols to reach, or no mallopt (not glibc)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
