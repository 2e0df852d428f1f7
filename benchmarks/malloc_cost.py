"""What glibc's malloc settings cost a training run: CPU seconds (user, system) and minor page
faults of whole ``fedrift run`` processes, one round, under each setting (issue 30 item 3).

glibc serves an allocation above its mmap threshold with a fresh ``mmap`` and gives it back
with ``munmap`` when freed; below it, from the heap, whose free top goes back to the kernel
once it exceeds the trim threshold. Both thresholds start at 128 KiB and the mmap one rises
with what is freed, up to 32 MiB. A ResNet-8 step on 64x64 images allocates activations of
8-32 MiB and frees them at the end of the step, so by default much of every step's memory is
handed back and faulted in again, page by page, in the next (system time). The settings are
glibc's environment variables, read when a process starts, so each row is a fresh process;
``shipped`` is fedrift's own setting (``fedrift/_malloc.py``, ``mallopt`` at import: both
thresholds), ``default`` turns it off (``FEDRIFT_MALLOC=default``) to show glibc's defaults,
and ``mmap 32 MiB`` raises only the mmap threshold (through glibc's variable, which also
stops its rise: the heap's top is still trimmed past 128 KiB).

    .venv/bin/python benchmarks/malloc_cost.py [--passes 2] -- -c examples/workload_r3.yaml data.size=64

Each pass runs every setting once (interleaved, so that a change of load hits them alike); the
table gives each setting's median over the passes, and every pass's figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS: dict[str, dict[str, str]] = {
    "default": {"FEDRIFT_MALLOC": "default"},
    "mmap 32 MiB": {"FEDRIFT_MALLOC": "default", "MALLOC_MMAP_THRESHOLD_": str(32 << 20)},
    "shipped (mmap 32 MiB, trim 1 GiB)": {},
}


def one_run(extra_env: dict[str, str], args: list[str], out: Path) -> dict[str, float]:
    """CPU seconds and minor faults of one ``fedrift run`` (its own process, waited with wait4)."""
    env = {k: v for k, v in os.environ.items() if k != "FEDRIFT_MALLOC" and not k.startswith("MALLOC_")}
    env.update(extra_env)
    cmd = [sys.executable, "-m", "fedrift.cli", "run", *args, "train.rounds=1", f"output.dir={out}",
           "output.progress=false"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        sys.exit(f"malloc_cost: the run failed: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    return {"user": usage.ru_utime, "sys": usage.ru_stime, "cpu": usage.ru_utime + usage.ru_stime,
            "faults": usage.ru_minflt / 1e6, "rss_gb": usage.ru_maxrss / 1e6, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("args", nargs="*", help="fedrift run's arguments, after --")
    ns = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for p in range(ns.passes):
            for i, (name, env) in enumerate(SETTINGS.items()):
                rows[name].append(one_run(env, ns.args, Path(tmp) / f"pass{p}-setting{i}"))
                r = rows[name][-1]
                print(f"pass {p} {name}: user {r['user']:.1f} sys {r['sys']:.1f} faults {r['faults']:.2f}M "
                      f"rss {r['rss_gb']:.2f} GB wall {r['wall']:.1f}", flush=True)
    base = statistics.median(r["cpu"] for r in rows["default"])
    print("\n| setting | user CPU s | system CPU s | CPU s | x default | minor faults (M) | peak RSS GB |")
    print("|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {name} | {med['user']:.1f} | {med['sys']:.1f} | {med['cpu']:.1f} | {base / med['cpu']:.2f} | "
              f"{med['faults']:.2f} | {med['rss_gb']:.2f} |")


if __name__ == "__main__":
    main()
