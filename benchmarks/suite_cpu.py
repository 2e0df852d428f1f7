"""Where the test suite's CPU goes: a pytest plugin that writes, per test, its wall seconds and
the CPU seconds of the test process and of the children it waited for; and a summary by file.

The suite is CPU-bound on 2 cores (its wall time is about its CPU time over 2), so its time
is cut by cutting CPU, and wall-clock durations alone mislead: a test that waits on a Ray
cluster shows a long duration and little CPU. What neither column sees: processes not waited
for by the test process (Ray's daemons and actors, the fork servers' workers, Flower's
processes); compare the sum with the machine's busy CPU over the whole run (``/proc/stat``,
printed here as ``busy``).

    PYTHONPATH=benchmarks SUITE_CPU_OUT=/tmp/suite_cpu.jsonl PYTHONDONTWRITEBYTECODE= \\
      .venv/bin/python -m pytest tests -n 2 --dist loadfile -p suite_cpu -q
    .venv/bin/python benchmarks/suite_cpu.py /tmp/suite_cpu.jsonl [top]
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict

import pytest

OUT = os.environ.get("SUITE_CPU_OUT", "/tmp/suite_cpu.jsonl")


def _busy() -> float:
    """CPU seconds the whole machine has been busy since boot (every core, idle and iowait out)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, (own, kids) = time.monotonic(), _cpu()
    yield
    own2, kids2 = _cpu()
    with open(OUT, "a") as f:
        f.write(json.dumps({"id": item.nodeid, "wall": time.monotonic() - wall, "self": own2 - own,
                            "children": kids2 - kids, "busy": _busy()}) + "\n")


def summary(path: str, top: int = 30) -> None:
    rows = [json.loads(line) for line in open(path)]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["id"].split("::")[0]]
        f[0] += r["wall"]
        f[1] += r["self"]
        f[2] += r["children"]
        f[3] += 1
    busy = [r["busy"] for r in rows]
    seen = sum(r["self"] + r["children"] for r in rows)
    print(f"{len(rows)} tests: {seen:.0f} CPU s seen (test processes and their waited children); "
          f"the machine busy {max(busy) - min(busy):.0f} CPU s between the first test's end and the last's")
    print(f"{'CPU s':>7} {'wall s':>7} {'tests':>5}  file")
    for name, (wall, own, kids, n) in sorted(by_file.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:top]:
        print(f"{own + kids:7.1f} {wall:7.1f} {n:5d}  {name}")


if __name__ == "__main__":
    summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
