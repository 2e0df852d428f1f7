"""Where a command's CPU goes by process: every process on the machine sampled from ``/proc``
every 0.25 s while the command runs, its CPU (user + system) summed by kind of process.

``benchmarks/suite_cpu.py`` sees what the test processes and the children they wait for use;
this sees the rest too (Ray's daemons and actors, Flower's processes, pool workers), which is
what a whole suite's time is made of on two cores. A process already running when sampling
starts counts from then; one that lives less than 0.25 s may be missed (its parent's CPU
does not include it until it is waited for).

    .venv/bin/python benchmarks/suite_processes.py /tmp/processes.json \\
        .venv/bin/python -m pytest tests -n 2 --dist loadfile -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

from suite_cpu import _busy as busy  # this folder's: the machine's busy CPU seconds

TICK = os.sysconf("SC_CLK_TCK")
KINDS = [  # (kind, any of these in the command line), first match wins
    ("the test processes (xdist workers)", ("-u -c import sys;exec",)),
    ("forkserver workers", ("multiprocessing.forkserver",)),
    ("Flower's", ("flower-", "flwr-", "fedrift.deploy.forkexec")),
    ("Ray's", ("/ray/", "bin/ray ", "ray::")),
    ("fedrift commands", ("fedrift.cli", "bin/fedrift")),
    ("chromium", ("chrom", "/proc/self/exe")),
    ("sphinx", ("sphinx",)),
    ("this sampler and pytest's main process", ("suite_processes.py", "-m pytest tests -n")),
]


def sample(seen: dict, first: bool = False) -> None:
    """{(pid, start time): [command line, CPU when first seen (0 if it started since), CPU now]}."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu, key = (int(fields[11]) + int(fields[12])) / TICK, (pid, fields[19])
            if key not in seen:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read().replace(b"\0", b" ").decode(errors="replace")
                seen[key] = [line, cpu if first else 0.0, cpu]
            seen[key][2] = max(seen[key][2], cpu)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue


def kind(line: str) -> str:
    return next((name for name, marks in KINDS if any(m in line for m in marks)), "others")


def main(out: str, command: list[str]) -> int:
    seen: dict = {}
    sample(seen, first=True)
    b0, w0 = busy(), time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen)
        time.sleep(0.25)
    wall, machine = time.monotonic() - w0, busy() - b0
    cpu, count = Counter(), Counter()
    for line, start, end in seen.values():
        cpu[kind(line)] += end - start
        count[kind(line)] += 1
    with open(out, "w") as f:
        json.dump({"wall": wall, "busy": machine, "processes": [[line, end - start] for line, start, end in seen.values()]}, f)
    print(f"wall {wall:.0f} s, the machine busy {machine:.0f} CPU s, the processes seen {sum(cpu.values()):.0f}")
    for name, seconds in cpu.most_common():
        print(f"{seconds:8.1f} CPU s {count[name]:5d} processes  {name}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
