"""The Flower deployment end to end: a real ``flower-superlink`` (TLS with certificates made
here, SuperNode authentication on) and two ``flower-supernode`` processes on loopback, each
registered with its own key and serving one fedrift client. FedAvg, FedGKD (a teacher),
SCAFFOLD (client state, kept on the devices) and SCAFFOLD under a step learning-rate schedule
(each device derives round 2's lr itself) deployed give the global model of fedrift's own
simulation of the same federation: the same clients each round, the same batches, the same
functions in the same order, so equal bit for bit here (asserted within 1e-6).

Each SuperNode reads its own ``data-root`` (node config), where the other client's training
inputs are NaN, and the server's copy has every training input NaN: a deployed run that read
any input it should not would not equal the simulation.

One is deployed under Flower's default isolation, a ClientApp process started per message
(torch, Flower and fedrift imported each time, about 3 s of a core; a SuperNode handles one
message at a time, so those starts are most of the time, and a second run there was the
suite's longest wait): SCAFFOLD under a step schedule (client state and a schedule, FedAvg's
model and aggregation beneath). The others go to a second federation beside it, whose
ClientApps (and ServerApps) are forked from a warm process (``fedrift.deploy.forkexec``): FedAvg again, FedGKD
(a teacher in the payload) and SCAFFOLD (its controls kept in the devices' Flower context must
cross the forked processes unchanged), FedACG (a look-ahead in the payload), FedDC (drift
variables in the devices' context) and Elastic (a sensitivity in each reply), so both
isolations are seen to give the simulation's model (the entries that change only the server's
step or the local loss, FedAdam, FedExP, FedSAM, send nothing else and are not deployed
here); that federation also shows that each
message still runs in a process of its own, and that stopping it ends every process it started,
a ServerApp still running among them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fedrift
from agreement import BITS, agree
from fedrift.cli import main

# flwr is an optional extra that `make test` installs: its absence is a set-up error, not a skip
assert importlib.util.find_spec("flwr") is not None, "the flower extra is missing: make test installs it (pip install 'fedrift[flower]')"

from fedrift.data.base import FEATURE_LIMIT  # noqa: E402
from fedrift.deploy.loopback import LoopbackFederation, gaussian_blobs  # noqa: E402
from fedrift.deploy.project import write_app  # noqa: E402

# the runs by the ClientApps' isolation: Flower's own process per message, or forked
ISOLATION = {"subprocess": ("scaffold_step",),
             "fork": ("fedavg_forked", "fedgkd", "scaffold", "fedacg", "feddc", "elastic")}
ALGORITHMS = tuple(a for algs in ISOLATION.values() for a in algs)  # the runs, by algorithm (or case)
WAVES = 2  # each federation's runs go in two waves: a few ServerApps starting at once
WAIT = 900  # seconds a deployed run may take: generous, as the machine may be busy with other tests
CASES = {"scaffold_step": ("scaffold", {"lr_schedule": "step", "lr_milestones": [2], "lr_gamma": 0.5}),
         "fedavg_forked": ("fedavg", {})}
ROUNDS = 2  # as _config
CLIENTS = 2


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Four Gaussian classes in 12 dimensions: 240 training samples, 80 test samples."""
    return gaussian_blobs(240, 80, dim=12, classes=4, spread=2.0, seed=seed)


def _config(root: Path, algorithm: str, out: Path) -> dict:
    algorithm, schedule = CASES.get(algorithm, (algorithm, {}))
    return {
        "seed": 0,
        "data": {"name": "npz", "root": str(root)},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": CLIENTS, "min_size": 5},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": algorithm},
        "engine": {"threads": 1, "executor": "sequential"},
        "train": {"rounds": 2, "clients_per_round": CLIENTS, "local_epochs": 1, "batch_size": 16, "lr": 0.05, **schedule},
        "output": {"dir": str(out), "progress": False},
    }


def _roots(base: Path) -> tuple[Path, dict[int, Path]]:
    """The full data (the simulation's), the server's copy (no training inputs) and each
    device's (only its own client's training inputs); labels everywhere: the partition is
    drawn from them."""
    full = _arrays()
    np.savez(_mkdir(base / "full") / "data.npz", **full)
    partition = fedrift.api.prepare(_config(base / "full", "fedavg", base / "unused")).partition
    # where a client's inputs are not, the largest feature fedrift takes (data.base.FEATURE_LIMIT;
    # NaN is refused as bad data): one step on it would change every result the test compares
    hidden = {**full, "x_train": np.full_like(full["x_train"], FEATURE_LIMIT)}
    np.savez(_mkdir(base / "server") / "data.npz", **hidden)
    devices = {}
    for k in range(CLIENTS):
        x = hidden["x_train"].copy()
        own = np.asarray(partition.train[k])
        x[own] = full["x_train"][own]
        np.savez(_mkdir(base / f"device{k}") / "data.npz", **{**full, "x_train": x})
        devices[k] = base / f"device{k}"
    return base / "full", devices


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """Every algorithm deployed on one of two loopback federations (by ``ISOLATION``), in
    ``WAVES`` on each, and simulated meanwhile: {algorithm: (flwr ls entry, run folder,
    simulation result)}, whether a SuperNode with an unregistered key was refused, each
    federation's logs, and of the forked one: each forkexec's log, whether the warm processes
    were still up after the runs, and every process it had started (a run that is still going
    when it stops among them)."""
    base = tmp_path_factory.mktemp("flower")
    full, devices = _roots(base / "data")
    node_config = {k: f'data-root="{root}"' for k, root in devices.items()}
    with contextlib.ExitStack() as stack:
        feds = {iso: stack.enter_context(LoopbackFederation(base / f"federation-{iso}", CLIENTS, node_config, isolation=iso))
                for iso in ISOLATION}
        refused: list = []
        intruder = threading.Thread(target=lambda: refused.append(feds["subprocess"].unregistered_node_refused()))
        intruder.start()
        # each federation's runs in WAVES, the two federations side by side (a thread each) while
        # the simulations run here: a few runs at a time, as ten ServerApps starting at once on a
        # loaded 2-core machine start slower than their task tokens last, and the SuperExec then
        # launches more of them
        with ThreadPoolExecutor(len(ISOLATION)) as pool:
            waves = [pool.submit(_deploy_in_waves, feds[iso], algs, base, iso == "fork") for iso, algs in ISOLATION.items()]
            simulated = {alg: fedrift.run(_config(full, alg, base / f"simulated-{alg}")) for alg in ALGORITHMS}
            entries = {alg: entry for w in waves for alg, entry in w.result().items()}
        intruder.join()
        logs = {alg: {name: _fed(feds, alg).log(name) for name in ("superlink", "supernode0", "supernode1")}
                for alg in ALGORITHMS}
        forked = feds["fork"]
        forkexec = {k: forked.log(f"forkexec{k}") for k in range(CLIENTS)}
        server = forked.log("forkexec-server")
        alive = all(p.poll() is None for p in forked.executors.values())
        started = forked.descendants()  # the long run's ServerApp among them
        assert started
    forks = SimpleNamespace(logs=forkexec, server=server, alive=alive, started=started)
    return {alg: (entries[alg], base / f"deployed-{alg}", simulated[alg]) for alg in ALGORITHMS}, refused[0], logs, forks


def _deploy_in_waves(fed: LoopbackFederation, algs: tuple[str, ...], base: Path, long: bool) -> dict:
    """{algorithm: flwr ls entry} of ``algs`` deployed on ``fed`` in ``WAVES``, each wave
    submitted once the last one's ServerApps have started (their config.yaml), so a few start
    at once; with ``long``, a run of 10,000 rounds joins the last wave, still running when the
    federation stops."""
    runs, size, started = {}, -(-len(algs) // WAVES), []
    for wave in range(WAVES):
        deadline = time.monotonic() + 120  # one that never starts fails in wait_all, with Flower's status
        while not all((base / f"deployed-{alg}" / "config.yaml").exists() for alg in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        started = list(algs[wave * size:(wave + 1) * size])
        for alg in started:
            runs[alg] = fed.submit(_app(base / f"app-{alg}", _config(base / "data" / "full", alg, base / f"deployed-{alg}"),
                                        base / "data" / "server"))
        if long and wave == WAVES - 1:
            cfg = _config(base / "data" / "full", "fedavg", base / "deployed-long")
            cfg["train"]["rounds"] = 10_000
            fed.submit(_app(base / "app-long", cfg, base / "data" / "server"))
    entries = fed.wait_all({run: base / f"deployed-{alg}" / "summary.json" for alg, run in runs.items()}, timeout=WAIT)
    return {alg: entries[run] for alg, run in runs.items()}


def _app(folder: Path, cfg: dict, server_root: Path) -> Path:
    """The app of ``cfg``, built where the data is whole (its data fingerprints, which each
    SuperNode's data must match, are of the full data), then pointed at the server's copy,
    which holds no training inputs: the server never reads them."""
    import tomllib

    import tomli_w

    write_app(folder, cfg)
    project = tomllib.loads((folder / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]["config"]
    doc = json.loads(app["fedrift-config"])
    doc["data"]["root"] = str(server_root)
    app["fedrift-config"] = json.dumps(doc, sort_keys=True)
    (folder / "pyproject.toml").write_text(tomli_w.dumps(project))
    return folder


def _fed(feds: dict, algorithm: str) -> LoopbackFederation:
    """The federation that ``algorithm`` is deployed on."""
    return next(feds[iso] for iso, algs in ISOLATION.items() if algorithm in algs)


@pytest.mark.process  # the loopback federations' runs
@pytest.mark.agreement
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_deployed_equals_simulation(deployed, algorithm):
    runs, _, logs, _ = deployed
    entry, folder, sim = runs[algorithm]
    assert entry["status"] == "finished:completed", (entry["status-details"], logs[algorithm]["superlink"][-3000:])
    agree(torch.load(folder / "final_model.pt"), sim.global_state, where=algorithm)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["executor"] == "flower"
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [r["round"] for r in sim.history] == [1, 2]
    keys = ("test_accuracy", "train_loss", "clients", "lr")
    agree([[r[k] for k in keys] for r in rows], [[r[k] for k in keys] for r in sim.history], where=algorithm)
    assert all(r["clients"] == CLIENTS for r in rows)
    if algorithm == "scaffold_step":  # round 2 at the decayed lr, on the devices as in the simulation
        assert [r["lr"] for r in rows] == [0.05, 0.025]
        # Flower's messages carry the tensors and their framing: more than the tensors, not much more
        mine, theirs = rows[-1], sim.history[-1]
        for key in ("bytes_down", "bytes_up"):
            assert theirs[key] < mine[key] < 1.5 * theirs[key] + 20_000, (key, mine[key], theirs[key])
    # the run's traffic as the SuperLink counted it (both ways, with the discovery round and
    # the HTTP requests' own bytes) covers what the rows report
    traffic = entry["network-traffic"]
    assert traffic["outbound-bytes"] + traffic["inbound-bytes"] >= summary["bytes_down_total"] + summary["bytes_up_total"]


@pytest.mark.process  # the loopback federations' runs
def test_supernode_authentication_is_on(deployed):
    _, (refused, log), _, _ = deployed
    assert refused, log[-2000:]
    assert "Failed to activate SuperNode" in log


@pytest.mark.process  # the loopback federations' runs
def test_client_state_stays_on_the_devices(deployed):
    """SCAFFOLD's controls were put in the devices' Flower context, none in the server's run
    folder; its run folder holds what fedrift run writes."""
    runs, _, _, _ = deployed
    _, folder, _ = runs["scaffold"]
    assert not (folder / "client_state.bin").exists()
    assert {p.name for p in folder.iterdir()} >= {"config.yaml", "partition.json", "metrics.jsonl", "summary.json",
                                                  "final_model.pt"}


@pytest.mark.process  # the loopback federations' runs
def test_each_message_runs_in_its_own_forked_process(deployed):
    """Per SuperNode and run on the forked federation: the discovery query, the rounds'
    training messages; each task in a process of its own, the warm process still up after them.
    The SuperLink's ServerApps likewise, one forked process a run."""
    *_, forks = deployed
    assert forks.alive
    for k, log in forks.logs.items():
        tasks = re.findall(r"fedrift forkexec: task (\d+) in process (\d+)", log)
        assert len(tasks) >= len(ISOLATION["fork"]) * (1 + ROUNDS), log[-2000:]
        assert len({pid for _, pid in tasks}) == len(tasks) and len({t for t, _ in tasks}) == len(tasks)
    # the SuperLink's ServerApps too: one forked process per run (the long run's among them)
    runs = re.findall(r"fedrift forkexec: task (\d+) in process (\d+)", forks.server)
    assert len(runs) == len(ISOLATION["fork"]) + 1 and len({pid for _, pid in runs}) == len(runs), forks.server[-2000:]


@pytest.mark.process  # the loopback federations' runs
def test_nothing_is_left_running(deployed):
    """The forked federation's stop ends every process its processes started, not only the ones
    it started itself: the ServerApp of a run still going (it outlived a SIGTERM before) and the
    warm processes' children."""
    *_, forks = deployed
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200] for pid in forks.started
            if Path(f"/proc/{pid}/cmdline").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"}
    assert not left


def test_an_unknown_isolation_is_refused(tmp_path):
    with pytest.raises(ValueError, match="isolation: 'thread'; allowed: subprocess, process, fork"):
        LoopbackFederation(tmp_path, CLIENTS, isolation="thread")


def test_app_project(tmp_path, capsys):
    """``fedrift flower app`` writes a Flower app whose run config carries the resolved config."""
    import tomllib

    assert main(["flower", "app", str(tmp_path / "app"), "train.rounds=3", "data.name=digits"]) == 0
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedrift.deploy.flower:server_app",
                                 "clientapp": "fedrift.deploy.flower:client_app"}
    doc = json.loads(app["config"]["fedrift-config"])
    assert doc["train"]["rounds"] == 3 and doc["algorithm"]["name"] == "fedavg"
    assert project["project"]["license"] == "Apache-2.0"  # Flower warns of an app without one
    prints = json.loads(app["config"]["data-fingerprints"])  # what each SuperNode's data must match
    assert sorted(prints, key=int) == [str(k) for k in range(20)] and all(v.count(":") == 2 for v in prints.values())
    assert app["config"]["fedrift-overrides"] == ""
    assert fedrift.api.prepare(doc).config.train.rounds == 3  # a config fedrift reads back
    out = capsys.readouterr().out
    assert "flwr run" in out
    # the deployment checklist, for this config: printed and kept beside the app
    steps = (tmp_path / "app" / "DEPLOY.md").read_text()
    assert "the partition has 20 clients (partition.num_clients), so 20 SuperNodes" in steps and "K = 0 ... 19" in steps
    assert "set engine.threads=1 for results equal" in steps and "--database state.db" in steps
    assert steps.splitlines()[2] in out and steps.splitlines()[-1] in out
    assert main(["flower", "app", str(tmp_path / "app1"), "data.name=digits", "partition.num_clients=3",
                 "engine.threads=1"]) == 0
    steps = (tmp_path / "app1" / "DEPLOY.md").read_text()
    assert "3 SuperNodes" in steps and "engine.threads is 1: the deployed run equals" in steps


@pytest.mark.parametrize("args, message", [
    (["algorithm.name=fedproto"], "algorithm.name: fedproto is evaluated on each client's personal model"),
    (["algorithm.name=fedbn", "model.name=resnet8", "model.width=4", "model.norm=batch"],
     "algorithm.name: fedbn is evaluated on each client's model with the part it keeps (FedBN: its BatchNorm)"),
    (["eval.drift=true"], "eval.drift: reads the clients' local models"),
    (["eval.personalize=true"], "eval.personalize: reads the clients' local models"),
    (["algorithm.name=ccvr"], "algorithm.name: ccvr calibrates on every client's feature statistics"),
])
def test_refusals(tmp_path, args, message, capsys):
    assert main(["flower", "app", str(tmp_path / "app"), "data.name=digits", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "app").exists()


def test_existing_folder_is_kept(tmp_path, capsys):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "mine.txt").write_text("keep")
    assert main(["flower", "app", str(tmp_path / "app"), "data.name=digits"]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "app" / "mine.txt").read_text() == "keep"


def test_missing_flwr_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr now raises ImportError
    assert main(["flower", "app", str(tmp_path / "app"), "data.name=digits"]) == 2
    err = capsys.readouterr().err
    assert err == "fedrift: error: flower: a Flower deployment needs the flwr package; install it with " \
                  "pip install 'fedrift[flower]'\n"


@pytest.mark.agreement
def test_records_round_trip():
    """Payloads, uploads and states travel as Flower records bit for bit, nesting, key order,
    scalars and empty dicts kept."""
    from fedrift.deploy.flower import decode, encode

    tree = {"params": {"fc.weight": torch.randn(3, 4).t(), "fc.bias": torch.zeros(3, dtype=torch.float64)},
            "teachers": {"1": {"w": torch.arange(5)}, "0": {"w": torch.ones(2, 2, dtype=torch.bfloat16).float()}},
            "kd_on": 1.0, "round": 3, "flag": True, "name": "x", "empty": {}, "scalar": torch.tensor(2.5)}
    back = decode(encode(tree, "payload"), "payload")
    assert list(back) == list(tree) and list(back["teachers"]) == ["1", "0"]
    for path in (("params", "fc.weight"), ("params", "fc.bias"), ("teachers", "1", "w"), ("scalar",)):
        a, b = tree, back
        for p in path:
            a, b = a[p], b[p]
        agree(a, b, BITS, where=str(path))
    assert (back["kd_on"], back["round"], back["flag"], back["name"], back["empty"]) == (1.0, 3, True, "x", {})
    assert type(back["round"]) is int and type(back["flag"]) is bool


class _SlowLink(LoopbackFederation):
    """A federation whose ``flwr run`` fails ``fails`` times, as a loaded SuperLink answering
    after the CLI's timeout does; ``starts``: whether each failed try started the run anyway."""

    def __init__(self, tmp_path, fails: int, starts: bool) -> None:
        super().__init__(tmp_path, 2)
        self.fails, self.starts, self.runs, self.tries = fails, starts, [], 0

    def flwr_json(self, *args: str) -> dict:
        if args[0] == "ls":
            return {"success": True, "runs": [{"run-id": r} for r in self.runs]}
        self.tries += 1
        if self.tries <= self.fails:
            if self.starts:
                self.runs.append(str(100 + self.tries))
            raise RuntimeError("flwr run failed: Connection to the SuperLink is unavailable")
        self.runs.append(str(100 + self.tries))
        return {"success": True, "run-id": self.runs[-1]}


@pytest.mark.parametrize("fails, starts, run_id, tries", [(0, False, "101", 1), (1, True, "101", 1),
                                                          (2, False, "103", 3)])
def test_a_late_superlink_answer_is_not_a_lost_or_doubled_run(tmp_path, monkeypatch, fails, starts, run_id, tries):
    monkeypatch.setattr("fedrift.deploy.loopback.time.sleep", lambda s: None)
    fed = _SlowLink(tmp_path, fails, starts)
    assert (fed.submit(tmp_path), fed.tries) == (run_id, tries)
    assert fed.submit(tmp_path) == str(100 + tries + 1)  # the next run: the known one is not taken again


def test_a_submission_failing_every_try_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr("fedrift.deploy.loopback.time.sleep", lambda s: None)
    with pytest.raises(RuntimeError, match="unavailable .try 3 of 3"):
        _SlowLink(tmp_path, 5, False).submit(tmp_path)


def test_a_device_with_other_data_is_refused_unless_accepted(caplog):
    """What a SuperNode's ClientApp does with its client's data fingerprint (the loopback
    federation of test_flower_failures.py sees it end to end): refused, or with
    data.accept_changed a warning line."""
    from fedrift.data.fingerprint import difference, rows_fingerprint
    from fedrift.deploy.flower import check_data
    from fedrift.errors import ConfigError

    prep = fedrift.api.prepare({"data": {"name": "digits"}, "partition": {"name": "iid", "num_clients": 3}})
    x, y = prep.dataset.x_train, prep.dataset.y_train
    check_data(prep, 1, rows_fingerprint(x, y, prep.partition.train[1]), None)  # the same data: nothing said
    assert not caplog.records
    other = rows_fingerprint(x.flip(0), y.flip(0), prep.partition.train[1])
    with pytest.raises(ConfigError, match=r"^client 1's training data read from data.name digits differs from the data "
                                          r"the app was built with: .*; allowed: .*data.accept_changed=true"):
        check_data(prep, 1, other, None)
    accepting = fedrift.api.prepare({"data": {"name": "digits", "accept_changed": True}, "partition": {"name": "iid", "num_clients": 3}})
    check_data(accepting, 1, other, "/data/there")
    assert [r.getMessage() for r in caplog.records] == [
        "fedrift: client 1's training data read from data-root /data/there differs from the data the app was built with: "
        + difference(rows_fingerprint(x, y, prep.partition.train[1]), other)
        + "; trained on as it is (data.accept_changed)"]


@pytest.mark.parametrize("overrides, expect", [
    ("", None),
    ('output.overwrite=true output.dir="/runs/again"', {"overwrite": True, "dir": "/runs/again"}),
    ("data.accept_changed=true", {"accept_changed": True}),
    ("train.rounds=5", "run config fedrift-overrides: 'train.rounds=5'; allowed: output.KEY=VALUE"),
    ("data.root=/elsewhere", "run config fedrift-overrides: 'data.root=/elsewhere'; allowed:"),
    ("output.overwrite", "run config fedrift-overrides: 'output.overwrite'; allowed:"),
])
def test_a_submission_may_change_the_output_keys(overrides, expect):
    """``flwr run APP SUPERLINK --run-config 'fedrift-overrides="..."'``: the run folder (and
    data.accept_changed) change without rebuilding the app; keys the clients' work depends
    on are refused in one line."""
    from fedrift.deploy.project import submitted_config
    from fedrift.errors import ConfigError

    doc = {"data": {"name": "digits"}, "output": {"dir": "/runs/first", "overwrite": False}}
    run_config = {"fedrift-config": json.dumps(doc), "fedrift-overrides": overrides}
    if isinstance(expect, str):
        with pytest.raises(ConfigError, match=re.escape(expect)):
            submitted_config(run_config)
        return
    got = submitted_config(run_config)
    section = "data" if expect and "accept_changed" in expect else "output"
    assert got[section] == {**doc[section], **(expect or {})}


def test_a_relative_output_dir_is_resolved_and_said_absolute(tmp_path, monkeypatch, capsys):
    """A relative output.dir is the ServerApp's working folder's: the run folder is made there
    and every line says it absolute (a federation that never connects ends the run here)."""
    from fedrift.deploy.flower import serve
    from fedrift.errors import ConfigError

    class NoSuperNodes:
        def get_node_ids(self) -> list[int]:
            return []

    monkeypatch.chdir(tmp_path)
    doc = {"data": {"name": "digits"}, "partition": {"name": "iid", "num_clients": 2}, "model": {"name": "mlp", "hidden": [8]},
           "engine": {"executor": "sequential", "checkpoint_every": 0}, "output": {"dir": "runs/deployed", "progress": False}}
    with pytest.raises(ConfigError, match="wait-seconds: no SuperNode served clients"):
        serve(NoSuperNodes(), doc, wait=0.0, reply_timeout=1.0)
    out = capsys.readouterr().out
    folder = tmp_path / "runs" / "deployed"
    assert f"fedrift: run folder {folder} on the ServerApp's machine" in out
    assert f"fedrift: config_error after 0 of 50 rounds; run folder {folder} (summary.json)" in out
    assert json.loads((folder / "summary.json").read_text())["status"] == "config_error"
