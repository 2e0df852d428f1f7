"""A Flower deployment's failures, on a real loopback federation (TLS, SuperNode
authentication, 3 SuperNodes): a SuperNode stopped mid-run with and without
``engine.accept_failures``, a device's config error, and what ends legibly in each case (the
ServerApp's log lines, ``summary.json``'s status, the model so far, Flower's own status).
The ClientApps are forked from a warm process beside each SuperNode, the ServerApps from one beside the SuperLink (``fedrift.deploy.forkexec``,
as test_flower.py's second federation): what fails here is a SuperNode, not a ClientApp start.
The three runs go to the SuperLink one after another; SuperNode 1 is stopped once both
training runs have finished round 1. SuperNode 2 reads its ``data-root`` (node config), which an embedded
dataset refuses: the config-error run. Without processes, on a clock that the waits' sleeps move:
a wait for runs goes on while they advance and gives up, saying where they stand, once they do
not; a round that gets no reply names the client it waits on, then fails it.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

assert importlib.util.find_spec("flwr") is not None, "the flower extra is missing: make test installs it (pip install 'fedrift[flower]')"

import fedrift  # noqa: E402
from fedrift.cli import main  # noqa: E402
from fedrift.deploy.loopback import LoopbackFederation, gaussian_blobs  # noqa: E402
from fedrift.deploy.project import write_app  # noqa: E402

CLIENTS = 3
# The stop lands once both training runs have finished round 1, and each must still be running
# then; runs submitted together begin training up to several seconds apart (seen: 8 s, two
# rounds). So the accept_failures run goes last, behind the stop run, which is planned long (it
# fails at the stop: its later rounds cost nothing); the accept run trains on without the
# node for its last rounds (about 4 s each: the SuperNodes ask for work every 3 s).
ROUNDS = 10
LONGER = 4  # the accept_failures run
VICTIM = 1  # the SuperNode (and client) stopped after round 1
# seconds a run may take: generous, as the machine may be busy with other tests; a wait gives up
# sooner, saying where each run stands, once no run has advanced for loopback.STALL seconds
WAIT = 900


def _config(root: Path, out: Path, rounds: int = ROUNDS, file: str = "data.npz", **engine) -> dict:
    return {
        "seed": 0,
        "data": {"name": "npz", "root": str(root), "file": file},
        "partition": {"name": "iid", "num_clients": CLIENTS},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithm": {"name": "fedavg"},
        "engine": {"threads": 1, "executor": "sequential", **engine},
        "train": {"rounds": rounds, "clients_per_round": CLIENTS, "local_epochs": 1, "batch_size": 16, "lr": 0.05},
        "output": {"dir": str(out), "progress": False},
    }


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """{name: (flwr ls entry, run folder, the run's log)} for the runs ``accept`` (accept_failures),
    ``stop`` (without) and ``config`` (an embedded dataset, refused by SuperNode 2's data-root)."""
    base = tmp_path_factory.mktemp("flower-failures")
    data, node2 = base / "data", base / "node2"  # the server's (and nodes 0 and 1's) files, SuperNode 2's
    data.mkdir()
    node2.mkdir()
    blobs = gaussian_blobs(120, 40, dim=6, classes=3, spread=2.0)
    np.savez(data / "data.npz", **blobs)
    np.savez(node2 / "data.npz", **blobs)
    digits = fedrift.api.prepare({"data": {"name": "digits"}}).dataset
    arrays = {"x_train": digits.x_train.numpy(), "y_train": digits.y_train.numpy(),
              "x_test": digits.x_test.numpy(), "y_test": digits.y_test.numpy()}
    np.savez(data / "digits.npz", **arrays)
    order = np.random.default_rng(0).permutation(len(arrays["y_train"]))  # SuperNode 2's copy: rows permuted
    np.savez(node2 / "digits.npz", **{**arrays, "x_train": arrays["x_train"][order], "y_train": arrays["y_train"][order]})
    configs = {  # submitted in this order, the first alone (it ends in round 1), the others together
        "permuted": _config(data, base / "run-permuted", rounds=2, file="digits.npz"),
        "stop": _config(data, base / "run-stop"),
        "config": {**_config(data, base / "run-config"), "data": {"name": "digits"}},
        "accept": _config(data, base / "run-accept", rounds=LONGER, accept_failures=True),
    }
    with LoopbackFederation(base / "federation", CLIENTS, {2: f'data-root="{node2}"'}, isolation="fork") as fed:
        ids = {}
        for name, cfg in configs.items():
            write_app(base / f"app-{name}", cfg)
            ids[name] = fed.submit(base / f"app-{name}")
            if name == "permuted":  # alone: four ServerApps starting at once on a loaded machine outlast their tokens
                fed.wait(ids[name], base / "run-permuted" / "summary.json", timeout=WAIT)
        fed.wait_rows({ids[name]: base / f"run-{name}" / "summary.json" for name in ("accept", "stop")}, 1, timeout=WAIT)
        fed.stop_node(VICTIM)
        waited = fed.wait_all({ids[name]: base / f"run-{name}" / "summary.json" for name in ids}, timeout=WAIT)
        entries = {name: waited[ids[name]] for name in ids}
        logs = {name: fed.run_log(ids[name]) for name in ids}
    return {name: (entries[name], base / f"run-{name}", logs[name]) for name in ids}


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.process  # the loopback federation's runs
def test_a_stopped_supernode_is_left_out_with_accept_failures(failures):
    entry, folder, log = failures["accept"]
    assert entry["status"] == "finished:completed", (entry["status-details"], log[-3000:])
    s = _summary(folder)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert s["status"] == "completed" and s["rounds"] == LONGER and len(rows) == LONGER
    lost = [r for r in rows if r["clients_failed"]]
    assert lost and rows[0]["clients_failed"] == 0  # stopped after round 1
    assert all(r["clients_failed"] == 1 and r["clients_returned"] == CLIENTS - 1 for r in lost)
    assert s["clients_failed_total"] == len(lost)
    # every client was sent the model, the stopped one too (as a simulation counts a failed
    # client's broadcast); only the returning ones' replies count up
    assert all(r["bytes_down"] == rows[0]["bytes_down"] for r in rows)
    assert all(r["bytes_up"] < rows[0]["bytes_up"] for r in lost)
    assert (folder / "final_model.pt").exists()
    for t in range(1, LONGER + 1):  # a progress line per round, and where the results are
        assert f"fedrift: round {t}/{LONGER}: test_accuracy" in log
    assert f"fedrift: completed {LONGER} rounds" in log and str(folder) in log


@pytest.mark.process  # the loopback federation's runs
def test_a_stopped_supernode_stops_the_run_without_accept_failures(failures):
    entry, folder, log = failures["stop"]
    assert entry["status"] == "finished:failed"
    s = _summary(folder)
    assert s["status"] == "failed" and 1 <= s["rounds"] < ROUNDS and s["executor"] == "flower"
    assert f"client {VICTIM} failed on SuperNode" in s["message"] and "unreachable" in s["message"]
    assert "engine.accept_failures=true" in s["message"]
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == s["rounds"]  # nothing written lost
    model = torch.load(folder / "final_model.pt")  # the model after the last round that finished
    assert model and all(bool(torch.isfinite(v).all()) for v in model.values())
    errors = [line for line in log.splitlines() if "fedrift: error:" in line]
    assert len(errors) == 1 and s["message"] in errors[0]
    assert f"fedrift: failed after {s['rounds']} of {ROUNDS} rounds; run folder {folder}" in log
    assert s["message"] in entry["status-details"]  # flwr ls says why
    # the log's last words are fedrift's: Flower's traceback and exit-code paragraph left out
    assert "Traceback" not in log and "Exit Code" not in log, log[-3000:]
    assert log.rstrip().splitlines()[-1].rstrip().endswith("(summary.json, final_model.pt: the model after that round)")
    assert s["clients_failed_total"] == 1  # the failure that stopped it


@pytest.mark.process  # the loopback federation's runs
def test_a_device_config_error_names_the_node(failures):
    entry, folder, log = failures["config"]
    assert entry["status"] == "finished:failed"
    s = _summary(folder)
    assert s["status"] == "config_error" and s["rounds"] == 0
    assert "(client 2): data.root: digits is embedded and reads no folder" in s["message"]
    assert s["message"].startswith("SuperNode ") and "accept_failures" not in s["message"]
    assert not (folder / "final_model.pt").exists()  # no round finished
    assert "fedrift: error: SuperNode" in log


@pytest.mark.process  # the loopback federation's runs
def test_a_supernode_with_other_data_is_refused_by_name(failures):
    """SuperNode 2 holds digits.npz with its rows permuted: its client's data fingerprint is
    not the one the app recorded, so the run stops in round 1 as a config error naming the
    node and what differs, before its update is used (it would finish with other numbers)."""
    entry, folder, log = failures["permuted"]
    assert entry["status"] == "finished:failed"
    s = _summary(folder)
    assert s["status"] == "config_error" and s["rounds"] == 0, s
    assert re.match(r"SuperNode \d+ \(client 2\): client 2's training data read from data-root .*node2 differs from "
                    r"the data the app was built with: ", s["message"]), s["message"]
    assert "data.accept_changed=true" in s["message"]
    assert not (folder / "metrics.jsonl").exists() or not (folder / "metrics.jsonl").read_text()


@pytest.mark.process  # the loopback federation's runs
def test_report_on_a_deployed_run_says_how_it_ended(failures, tmp_path):
    """``fedrift report`` on a deployed run that failed names its status and reason; given the
    run folder itself, it writes its files beside it, never inside."""
    import shutil

    from fedrift.report.html import build_report

    _, folder, _ = failures["stop"]
    runs = tmp_path / "runs"
    shutil.copytree(folder, runs / "stop")
    said: list[str] = []
    build_report(runs, {"plots": False}, echo=said.append)
    message = _summary(folder)["message"]
    line = next(x for x in said if str(runs / "stop") in x)
    assert f"failed after round {_summary(folder)['rounds']}: {message}" in line and "flwr run APP SUPERLINK" in line
    before = sorted(p.name for p in (runs / "stop").iterdir())
    said.clear()
    _, html = build_report(runs / "stop", {"plots": False}, echo=said.append)
    assert sorted(p.name for p in (runs / "stop").iterdir()) == before
    assert html == runs / "stop-report" / "report.html" and html.is_file() and (runs / "stop-report" / "results.csv").is_file()
    assert any("a run folder: the report goes beside it" in x for x in said)


@pytest.mark.process  # the loopback federation's runs
def test_resume_of_a_deployed_run_is_refused(failures, capsys):
    """``fedrift run --resume`` would run the federation again locally: refused in one line
    that says how a deployed run continues; ``report`` says the same, not --resume."""
    _, folder, _ = failures["stop"]
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert main(["run", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a Flower deployment's run" in err and "flwr run APP SUPERLINK" in err
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    (folder / "summary.json").unlink()  # as if the ServerApp had been killed: the report calls it interrupted
    from fedrift.report.html import build_report

    said: list[str] = []
    build_report(folder.parent, {"plots": False}, html_path=folder.parent / "report.html", echo=said.append)
    line = next(x for x in said if str(folder) in x)
    assert "a deployed run" in line and "--resume" not in line and "flwr run APP SUPERLINK" in line


@pytest.mark.parametrize("args, message", [
    (["engine.dropout=0.2"], "engine.dropout: simulates clients that fail"),
    (["engine.stragglers=0.5"], "engine.stragglers: simulates clients that fail"),
    (["engine.executor=ray"], "engine.executor: a Flower deployment trains each client on its own SuperNode"),
    (["engine.ray_address=10.0.0.1:6379"], "engine.ray_address: '10.0.0.1:6379' is read by engine.executor ray only"),
    (["engine.checkpoint_every=5"], "engine.checkpoint_every: 5; a deployed run keeps no checkpoints"),
    (["engine.compile=true"], "engine.compile: true compiles the simulation's vectorised step"),
])
def test_what_a_deployment_cannot_honour_is_refused(tmp_path, args, message, capsys):
    assert main(["flower", "app", str(tmp_path / "app"), "data.name=digits", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "app").exists()


def test_the_app_keeps_no_checkpoints(tmp_path):
    """checkpoint_every's default (10) becomes 0 in the app, not a refusal."""
    import tomllib

    write_app(tmp_path / "app", None, ["data.name=digits"])
    doc = json.loads(tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
                     ["fedrift-config"])
    assert doc["engine"]["checkpoint_every"] == 0


class _Scripted(LoopbackFederation):
    """A federation (no processes) with one run, ``7``, that finishes a round every ``every``
    seconds of ``clock`` (what the waits read; their sleeps move it) and completes after
    ``rounds``; with ``every`` None it stops after round 1, still running, as a run whose
    reply never comes."""

    def __init__(self, folder: Path, rounds: int, every: float | None, clock: list[float]) -> None:
        super().__init__(folder, CLIENTS)
        self.rounds, self.every, self.clock = rounds, every, clock
        self.done = folder / "run" / "summary.json"
        self.done.parent.mkdir()

    def flwr_json(self, *args: str) -> dict:
        if args[0] == "supernode":
            return {"nodes": [{"status": "online"}] * (CLIENTS - 1)}
        rows = 1 if self.every is None else min(self.rounds, int(self.clock[0] // self.every))
        (self.done.parent / "metrics.jsonl").write_text("{}\n" * rows)
        if rows == self.rounds:
            self.done.write_text("{}")
        status = "finished:completed" if rows == self.rounds else "running"
        return {"runs": [{"run-id": "7", "status": status, "status-details": ""}]}

    def run_log(self, run_id: str) -> str:
        return f"fedrift: round 1/{self.rounds}: test_accuracy 0.9000, train_loss 0.5\n"


@pytest.fixture
def clock(monkeypatch):
    """The clock the waits read (``time.monotonic``), made to move by their sleeps: a wait of
    minutes takes none."""
    now = [0.0]
    monkeypatch.setattr("time.monotonic", lambda: now[0])
    monkeypatch.setattr("time.sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def test_a_wait_goes_on_while_the_rounds_advance(tmp_path, clock):
    """A loaded machine's run, a round every 200 s: waited for past the stall time (300 s), as
    long as it advances."""
    fed = _Scripted(tmp_path, 4, 200.0, clock)
    assert fed.wait_all({"7": fed.done}, timeout=900, stall=300)["7"]["status"] == "finished:completed"
    assert 800 <= clock[0] < 815


def test_a_wait_gives_up_once_nothing_advances_saying_where_the_run_stands(tmp_path, clock):
    fed = _Scripted(tmp_path, 4, None, clock)
    with pytest.raises(TimeoutError) as caught:
        fed.wait_all({"7": fed.done}, timeout=900, stall=300)
    assert 300 < clock[0] < 302  # the stall time, not the timeout
    said = str(caught.value)
    assert said.startswith("Flower runs 7 did not finish: nothing advanced (rounds, Flower's status) for 300 s")
    assert "run 7: flwr ls running (no details), 1 round(s) in metrics.jsonl, summary.json not written" in said
    assert "its log ends:\nfedrift: round 1/4: test_accuracy" in said and said.endswith("SuperNodes online: 2 of 3")


def test_a_wait_for_a_round_ends_at_once_if_the_run_finished_before_it(tmp_path, clock):
    fed = _Scripted(tmp_path, 0, 1.0, clock)  # finished with no round
    with pytest.raises(TimeoutError, match="did not finish round 1: runs 7 finished first .0 s waited"):
        fed.wait_rows({"7": fed.done}, 1, timeout=900, stall=300)
    assert clock[0] == 0


def test_a_round_says_whom_it_waits_on_and_fails_them_after_reply_seconds(clock, capsys, monkeypatch):
    """A reply that never comes (a lost message, a hung device): the ServerApp's log names the
    client and its SuperNode each minute, and after ``reply-seconds`` the client has failed,
    left out under accept_failures, else the run stops naming it."""
    from types import SimpleNamespace

    from flwr.supercore.task_identity import TaskIdentity

    from fedrift.deploy.flower import DeviceError, exchange

    for name in ("_task_id", "_run_id", "_node_id"):  # what a ServerApp process has when it makes a Message
        monkeypatch.setattr(TaskIdentity, name, 1)

    class Silent:  # Flower's Grid as exchange uses it: the message goes out, no reply comes back
        def push_messages(self, msgs):
            return [f"message{i}" for i, _ in enumerate(msgs)]

        def pull_messages(self, ids):
            return []

    rnd = SimpleNamespace(t=2, jobs=[SimpleNamespace(client_id=1)], payload={"w": torch.zeros(2)},
                          fate=SimpleNamespace(work={}))
    replies, failed, down, up = exchange(Silent(), {1: 11}, rnd, "train", 150.0, accept=True)
    assert (replies, failed, up) == ({}, [1], 0) and down > 0 and 150 <= clock[0] < 154
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 2 and all(re.fullmatch(r"fedrift: round 2: waited \d+ s for the train replies of clients 1 "
                                               r"\(SuperNode 11\); up to 150 s \(run config reply-seconds\)", x) for x in said)
    with pytest.raises(DeviceError, match=r"^round 2: client 1 failed on SuperNode 11: no reply within 150 s "
                                          r"\(run config reply-seconds\); the run stopped") as caught:
        exchange(Silent(), {1: 11}, rnd, "train", 150.0, accept=False)
    assert caught.value.clients == [1]
