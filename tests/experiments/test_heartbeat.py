"""A study or compare says when each run starts and, while runs train, a line per run at least
every minute (here every fraction of a second): the round, the accuracy, the rest's estimate."""

from __future__ import annotations

import json
import time

import yaml

import fedrift
from fedrift.engine import outputs
from fedrift.engine.folder_lock import LOCK_NAME, FolderLock
from fedrift.experiments import heartbeat
from fedrift.experiments.heartbeat import Heartbeat, in_progress

from conftest import grid_config


def _running_folder(root, rounds=50, rows=()):
    folder = root / "fedprox-mu=0.01" / "seed0"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"train": {"rounds": rounds}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"round": 1')  # a torn tail
    return folder


def test_a_run_whose_lock_is_held_is_said_with_its_round_accuracy_and_rest(tmp_path):
    folder = _running_folder(tmp_path, rows=[{"round": 9, "test_accuracy": 0.3}, {"round": 10, "test_accuracy": 0.412}])
    said: list[str] = []
    with FolderLock(folder, "test"):
        (running,) = in_progress([tmp_path])
        assert (running.name, running.round, running.rounds, running.accuracy) == ("fedprox-mu=0.01/seed0", 10, 50, 0.412)
        line = running.line(running.started + 100)  # 100 s for 10 rounds: 400 s for the 40 left (rounded)
        assert line == "fedprox-mu=0.01/seed0: round 10/50, accuracy 41.2%, 2 min in, about 7 min left", line
        with Heartbeat([tmp_path], said.append, every=0.3, poll=0.05):
            start = time.monotonic()
            while sum("round 10/50" in s for s in said) < 2 and time.monotonic() - start < 20:
                time.sleep(0.05)
            took = time.monotonic() - start
    assert said[0].startswith("fedprox-mu=0.01/seed0: starts (50 rounds; pid ")
    beats = [s for s in said if "round 10/50, accuracy 41.2%" in s]
    assert len(beats) >= 2 and took >= 0.55, (took, said)  # a beat every 0.3 s, not sooner
    assert in_progress([tmp_path]) == []  # the lock released: nothing in progress
    idle: list[str] = []
    with Heartbeat([tmp_path], idle.append, every=0.3, poll=0.05):
        start = time.monotonic()
        while not idle and time.monotonic() - start < 20:
            time.sleep(0.05)
    assert idle and idle[0].startswith("working: no run has its folder yet"), idle


def test_a_lock_left_by_a_dead_process_is_no_run_in_progress(tmp_path):
    folder = _running_folder(tmp_path)
    (folder / LOCK_NAME).write_text("pid 999999999 on " + __import__("socket").gethostname() + " since 2026-01-01 00:00:00")
    assert in_progress([tmp_path]) == []


def test_compare_says_each_runs_start_and_its_progress_every_beat(tmp_path, monkeypatch, capsys):
    """A real compare, one round a second: its output has the start line, progress lines with
    the round, and the end line with the rounds."""
    log = outputs.RunWriter.log

    def slow(self, row):
        log(self, row)
        time.sleep(0.6)

    monkeypatch.setattr(outputs.RunWriter, "log", slow)
    monkeypatch.setattr(heartbeat, "EVERY", 0.5)
    monkeypatch.setattr(heartbeat, "POLL", 0.1)
    cfg = grid_config(tmp_path, train={"rounds": 3})
    fedrift.compare(cfg, algorithms=["fedavg"], seeds=[0], out=tmp_path / "cmp", report=False)
    out = capsys.readouterr().out
    assert "fedavg/seed0: starts (3 rounds; pid " in out
    assert any(line.startswith("fedavg/seed0: round ") and "/3, accuracy " in line for line in out.splitlines()), out
    assert "[1/1] fedavg seed 0: final " in out and ", 3 rounds, " in out
