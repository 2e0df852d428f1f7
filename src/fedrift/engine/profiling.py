"""Labels for ``torch.profiler`` around the engine's phases (``benchmarks/gpu_throughput.py``
reads them), free when no profiler runs: ``record_function`` costs microseconds a call even
then, which a small model's local step (tens of microseconds) would feel."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager

import torch
from torch.profiler import record_function

_NOTHING = nullcontext()


def labeller() -> Callable[[str], ContextManager[object]]:
    """Asked once per client or group: ``record_function`` while a profiler records, else a
    function that hands back one context that does nothing."""
    if torch._C._autograd._profiler_enabled():
        return record_function
    return lambda _name: _NOTHING
