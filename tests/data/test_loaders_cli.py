"""The file datasets through the CLI: one command trains on them; a damaged file is refused
with one line and exit 2 before the run folder exists."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import formats
from fedrift.cli import main

FAST = ["model.name=mlp", "model.hidden=[16]", "train.rounds=1", "train.clients_per_round=2",
        "train.local_epochs=1", "train.batch_size=4", "output.progress=false"]


def _run(tmp_path, *args):
    out = tmp_path / "run"
    return main(["run", *FAST, f"output.dir={out}", *args]), out


def test_cifar10_runs_in_one_command(tmp_path):
    formats.cifar10(tmp_path / "data")
    code, out = _run(tmp_path, "data.name=cifar10", f"data.root={tmp_path / 'data'}",
                     "partition.name=iid", "partition.num_clients=3")
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "cifar10" and 0.0 <= summary["final_accuracy"] <= 1.0


def test_femnist_natural_partition_runs_in_one_command(tmp_path):
    formats.femnist(tmp_path / "leaf")
    code, out = _run(tmp_path, "data.name=femnist", f"data.root={tmp_path / 'leaf'}", "partition.name=natural")
    assert code == 0
    assert json.loads((out / "summary.json").read_text())["num_clients"] == 3


NATURAL = "femnist has natural groups (3 writers); this run partitions it by iid over 3 clients; " \
          "partition.name=natural uses the writers"


def test_femnist_split_by_another_partition_says_so_once_per_command(tmp_path, monkeypatch, caplog):
    """A dataset with natural groups run without ``partition.name=natural`` says so in one line:
    once for the whole compare (each of its runs prepares the data), none with natural. A pool
    worker inherits the command's environment, where the line is marked said, so it stays quiet
    too (checked as the worker sees it, without starting a pool: that costs 25 s here)."""
    from fedrift.data.notices import SAID, say_once

    monkeypatch.delenv(SAID, raising=False)
    formats.femnist(tmp_path / "leaf")
    data = ["data.name=femnist", f"data.root={tmp_path / 'leaf'}", "partition.name=iid", "partition.num_clients=3"]
    assert main(["compare", "--no-report", "--out", str(tmp_path / "grid"), "seeds=0,1", *FAST, *data]) == 0
    assert len(list((tmp_path / "grid").glob("*/seed*/summary.json"))) == 2  # both runs ran
    said = [r.getMessage() for r in caplog.records if "natural groups" in r.getMessage()]
    assert said == [NATURAL], said
    assert SAID in os.environ and not say_once(NATURAL)  # a worker started now: quiet
    caplog.clear()
    code, _ = _run(tmp_path, *data[:2], "partition.name=natural")
    assert code == 0 and not [r for r in caplog.records if "natural groups" in r.getMessage()]


@pytest.mark.parametrize(
    "name, make, damage, names",
    [
        ("cifar10", formats.cifar10, lambda d: (d / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02}q"),
         "test_batch is truncated or malformed"),
        ("cifar100", formats.cifar100, lambda d: (d / "cifar-100-python" / "meta").unlink(), "meta is missing"),
        ("tinyimagenet", formats.tinyimagenet, lambda d: (d / "tiny-imagenet-200" / "wnids.txt").write_text(""),
         "wnids.txt is truncated or malformed"),
        ("femnist", formats.femnist, lambda d: next((d / "test").glob("*.json")).write_text("{"),
         ".json is truncated or malformed"),
        ("npz", lambda d: d.mkdir(parents=True), lambda d: (d / "x.npz").write_bytes(b"PK\x03\x04junk"),
         "x.npz is truncated or malformed"),
        ("office_caltech10", formats.office_caltech10, lambda d: shutil.rmtree(d / "dslr"), "dslr is missing"),
        ("office_caltech10", formats.office_caltech10,
         lambda d: (d / "webcam" / "mug" / "frame_0001.jpg").write_bytes(b"\xff\xd8\xffjunk"),
         "frame_0001.jpg is truncated or malformed"),
    ],
)
def test_damaged_files_get_one_line_exit_2_and_no_run_folder(capsys, tmp_path, name, make, damage, names):
    data = tmp_path / "data"
    make(data)
    damage(data)
    code, out = _run(tmp_path, f"data.name={name}", f"data.root={data}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("fedrift: error: data: "), err
    assert names in err[0]
    assert not out.exists()


def test_office_caltech10_domain_partition_runs_in_one_command(tmp_path):
    formats.office_caltech10(tmp_path / "office")
    code, out = _run(tmp_path, "data.name=office_caltech10", f"data.root={tmp_path / 'office'}", "data.size=16",
                     "partition.name=domain", "partition.clients_per_domain=[1,1,2,1]")
    assert code == 0
    assert json.loads((out / "partition.json").read_text())["options"]["domains"] == [
        "amazon", "caltech", "dslr", "dslr", "webcam"]


def test_no_root_says_what_the_folder_must_hold(capsys, tmp_path):
    code, out = _run(tmp_path, "data.name=tinyimagenet")
    err = capsys.readouterr().err
    assert code == 2 and "data.root" in err and "tiny-imagenet-200" in err and not out.exists()
