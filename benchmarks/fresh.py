"""What the memory benchmarks share: each configuration in a fresh process, so that its peak
memory is its own, reported back as the last line of its output (JSON)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any


def peak_mb() -> float:
    """This process's own peak resident memory (VmHWM). Not ru_maxrss: a spawned child
    inherits its parent's peak as a floor there."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_fresh_process(script: str, args: list[str]) -> dict[str, Any]:
    """Run ``script`` with ``args`` (its child mode) in a new interpreter with one OpenMP
    thread; the JSON object its last output line holds. The row is echoed as it comes."""
    done = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    row = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row
