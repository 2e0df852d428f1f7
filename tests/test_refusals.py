"""Refusals a new user met (issue 17 items 4 and 6): a refused config leaves no folder behind;
no silent or crashing edges (data.root ignored, a closed pipe, a folder as config, YAML errors)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedrift.cli import main
from fedrift.data import DATASETS, FROM_ROOT

FAST = ["data.name=digits", "model.name=logreg", "partition.num_clients=10", "partition.min_size=2",
        "train.rounds=1", "train.local_epochs=1", "output.progress=false", "engine.executor=sequential"]


def _refused(capsys, args, *expect):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedrift: error: ") and all(e in err[0] for e in expect), err
    return err[0]


def test_a_refused_cohort_leaves_no_folder_and_the_fixed_command_runs(capsys, tmp_path):
    out = tmp_path / "runs" / "m1"
    _refused(capsys, ["run", *FAST, "train.clients_per_round=50", f"output.dir={out}"],
             "train.clients_per_round: 50", "10 clients", "allowed: 1..10")
    assert not out.exists() and not out.parent.exists()
    assert main(["run", *FAST, "train.clients_per_round=5", f"output.dir={out}"]) == 0


def test_a_compare_refuses_the_cohort_before_any_run(capsys, tmp_path):
    _refused(capsys, ["compare", "--out", str(tmp_path / "g"), "seeds=0", *FAST, "train.clients_per_round=50"],
             "train.clients_per_round")
    assert not (tmp_path / "g").exists()


def test_a_refusal_only_the_first_round_can_make_leaves_nothing(capsys, tmp_path):
    # client-level privacy learns at the first upload that scaffold sends more than the model
    out = tmp_path / "p"
    _refused(capsys, ["run", *FAST, "algorithm.name=scaffold", "privacy.level=client", f"output.dir={out}"],
             "privacy.level")
    assert not out.exists()
    kept = tmp_path / "kept"  # a folder that existed before: it stays, without the refused run's files
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    _refused(capsys, ["run", *FAST, "algorithm.name=scaffold", "privacy.level=client", f"output.dir={kept}"], "privacy")
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


def test_data_root_with_an_embedded_dataset_is_refused_naming_those_that_read_one(capsys, tmp_path):
    line = _refused(capsys, ["run", *FAST, f"data.root={tmp_path}", f"output.dir={tmp_path / 'r'}"],
                    "data.root: digits is embedded")
    assert all(name in line for name in FROM_ROOT)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", sorted(e.name for e in DATASETS if e.source == "built in"))
def test_from_root_lists_exactly_the_datasets_that_need_a_folder(name):
    from fedrift.config import validate_options
    from fedrift.data import load_dataset
    from fedrift.errors import DataError

    options = validate_options("data", DATASETS.get(name).params, {})
    if name in FROM_ROOT:
        with pytest.raises(DataError, match="data.root"):
            load_dataset(name, None, options)
    else:
        assert load_dataset(name, None, options).num_classes > 1


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "femnist", "sst5", "agnews"])
def test_a_file_as_the_root_of_a_dataset_read_from_a_folder_is_called_a_file(capsys, tmp_path, name):
    """data.root=.../x.npz where a folder is read: said to be a file, not a folder that lacks
    the dataset's files (the image datasets take a .zip there, npz the .npz itself)."""
    (tmp_path / "x.npz").write_bytes(b"PK")
    _refused(capsys, ["run", *FAST, f"data.name={name}", f"data.root={tmp_path / 'x.npz'}", f"output.dir={tmp_path / 'r'}"],
             f"data.root: {tmp_path / 'x.npz'} is a file; data.name {name} reads a folder; allowed: a folder holding ")
    assert not (tmp_path / "r").exists()


def test_a_folder_as_config_file_is_called_a_folder(capsys, tmp_path):
    _refused(capsys, ["run", "-c", str(tmp_path)], "is a folder", "allowed: a YAML file")


def test_yaml_errors_name_the_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {name: digits\nmodel: [\n")
    line = _refused(capsys, ["run", "-c", str(bad)], "not valid YAML")
    assert f'in "{bad}", line' in line and "<unicode string>" not in line


@pytest.mark.process
@pytest.mark.parametrize("args", [["list"], ["run", *FAST, "train.clients_per_round=2", "output.dir={out}"]])
def test_a_closed_pipe_ends_quietly(tmp_path, args):
    """fedrift list | head -3 and fedrift run ... | head -1: the reader is gone before we write."""
    read, write = os.pipe()
    os.close(read)
    args = [a.replace("{out}", str(tmp_path / "r")) for a in args]
    proc = subprocess.run([sys.executable, "-m", "fedrift.cli", *args], stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
    if args[0] == "run":
        assert (tmp_path / "r" / "summary.json").is_file()  # the run itself completed
