"""ClientApp processes forked from a warm process (``fedrift.deploy.forkexec`` beside each
SuperNode started with ``--isolation process``): a deployed run gives the simulation's global
model, as with Flower's own process per message (tests/deploy/test_flower.py), and every
message still runs in a process of its own. SCAFFOLD keeps client state in the devices'
Flower context from one message to the next: it must cross the forked processes unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import fedrift

assert importlib.util.find_spec("flwr") is not None, "the flower extra is missing: make test installs it (pip install 'fedrift[flower]')"

from fedrift.deploy.loopback import LoopbackFederation, gaussian_blobs  # noqa: E402
from fedrift.deploy.project import write_app  # noqa: E402
from test_flower import CLIENTS, _config  # noqa: E402  (the same federation config: npz blobs, 2 clients, 2 rounds)

ALGORITHMS = ("fedavg", "scaffold")
ROUNDS = 2  # as test_flower's _config
WAIT = 900  # seconds a run may take: generous, as the machine may be busy with other tests



@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """Both algorithms deployed at once on a federation whose ClientApps are forked:
    {algorithm: (flwr ls entry, run folder, simulation)}, and each forkexec's log."""
    base = tmp_path_factory.mktemp("forkexec")
    (base / "data").mkdir()
    np.savez(base / "data" / "data.npz", **gaussian_blobs(240, 80, dim=12, classes=4, spread=2.0))
    with LoopbackFederation(base / "federation", CLIENTS, isolation="fork") as fed:
        runs = {}
        for alg in ALGORITHMS:
            write_app(base / f"app-{alg}", _config(base / "data", alg, base / f"deployed-{alg}"))
            runs[alg] = fed.submit(base / f"app-{alg}")
        long = _config(base / "data", "fedavg", base / "deployed-long")
        long["train"]["rounds"] = 10_000
        fed.submit(write_app(base / "app-long", long))  # still running when the federation stops
        simulated = {alg: fedrift.run(_config(base / "data", alg, base / f"simulated-{alg}")) for alg in ALGORITHMS}
        entries = {alg: fed.wait(runs[alg], base / f"deployed-{alg}" / "summary.json", timeout=WAIT) for alg in ALGORITHMS}
        logs = {k: fed.log(f"forkexec{k}") for k in range(CLIENTS)}
        alive = all(p.poll() is None for p in fed.executors.values())
        started = fed.descendants()  # the long run's ServerApp among them
        assert started
    return ({alg: (entries[alg], base / f"deployed-{alg}", simulated[alg]) for alg in ALGORITHMS}, logs, alive,
            started)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_forked_clientapps_equal_simulation(forked, algorithm):
    runs, logs, _, _ = forked
    entry, folder, sim = runs[algorithm]
    assert entry["status"] == "finished:completed", (entry["status-details"], logs[0][-3000:])
    model = torch.load(folder / "final_model.pt")
    assert model.keys() == sim.global_state.keys()
    for key in model:
        assert torch.equal(model[key], sim.global_state[key]), f"{algorithm}: {key} differs"
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in sim.history]


def test_each_message_runs_in_its_own_forked_process(forked):
    """Per SuperNode and run: the discovery query, the rounds' training messages; each task
    in a process of its own, the warm process still up after them."""
    _, logs, alive, _ = forked
    assert alive
    for k, log in logs.items():
        tasks = re.findall(r"fedrift forkexec: task (\d+) in process (\d+)", log)
        assert len(tasks) >= len(ALGORITHMS) * (1 + ROUNDS), log[-2000:]
        assert len({pid for _, pid in tasks}) == len(tasks) and len({t for t, _ in tasks}) == len(tasks)


def test_nothing_is_left_running(forked):
    """The federation's stop ends every process its processes started, not only the ones it
    started itself: the ServerApp of a run still going (it outlived a SIGTERM before) and the
    warm processes' children."""
    *_, started = forked
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200] for pid in started
            if Path(f"/proc/{pid}/cmdline").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"}
    assert not left


def test_an_unknown_isolation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="isolation: 'thread'; allowed: subprocess, process, fork"):
        LoopbackFederation(tmp_path, CLIENTS, isolation="thread")
