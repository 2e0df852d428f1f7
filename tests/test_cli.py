import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedrift.cli import main

FAST = ["data.name=digits", "model.name=logreg", "partition.num_clients=4", "partition.min_size=2",
        "train.rounds=1", "train.clients_per_round=2", "train.local_epochs=1", "output.progress=false"]


def _fails(capsys, args, expect_key):
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("fedrift: error: ") and expect_key in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("algorithm.name=fedsomething", "algorithm.name", "allowed: "),
        ("data.name=cifar11", "data.name", "mnist5k"),
        ("model.name=vgg", "model.name", "cnn"),
        ("train.colour=red", "train.colour", "local_epochs"),
        ("partition.alpha=0", "partition.alpha", "greater than 0"),
        ("partition.alpha=-1", "partition.alpha", "greater than 0"),
        ("partition.num_clients=5000", "partition.num_clients", "at most"),
        ("train.participation=1.5", "train.participation", "less than or equal to 1"),
        ("train.participation=0", "train.participation", "greater than 0"),
        ("data.root=/no/such/folder", "data.root", "does not exist"),
        ("engine.executor=warp", "engine.executor", "sequential"),
        ("algorithm.mu=0.1", "algorithm.mu", "aggregation"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(capsys, tmp_path, override, key, allowed):
    line = _fails(capsys, ["run", *FAST, f"output.dir={tmp_path / 'r'}", override], key)
    assert allowed in line
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_missing_config_file(capsys, tmp_path):
    _fails(capsys, ["run", "-c", str(tmp_path / "nope.yaml")], "does not exist")


def test_run_prints_where_results_are(capsys, tmp_path):
    assert main(["run", *FAST, f"output.dir={tmp_path / 'r'}"]) == 0
    out = capsys.readouterr().out
    assert f"results in {tmp_path / 'r'}" in out and "final accuracy" in out
    assert (tmp_path / "r" / "metrics.jsonl").is_file()


def test_list_names_every_registry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("algorithms:", "fedavg", "fedprox", "datasets:", "mnist5k", "digits", "synthetic", "mnist1d",
                 "models:", "cnn", "mlp", "logreg", "resnet8", "partitions:", "iid", "dirichlet", "shards",
                 "quantity", "natural", "executors:", "sequential"):
        assert word in out, word


def test_partition_prints_the_table_and_writes_the_plot(capsys, tmp_path):
    out_dir = tmp_path / "p"
    code = main(["partition", "data.name=digits", "partition.name=shards", "partition.num_clients=5",
                 "partition.classes_per_client=2", "--out", str(out_dir)])
    assert code == 0
    text = capsys.readouterr().out
    assert text.count("\n") >= 6  # header + 5 clients + totals
    png = out_dir / "partition.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out_dir / "partition.json").is_file()


def test_console_script_exit_status(tmp_path):
    """The installed entry point, as a user runs it: exit 2 and no traceback."""
    exe = Path(sys.executable).with_name("fedrift")
    proc = subprocess.run([str(exe), "run", "algorithm.name=nope"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unknown algorithm 'nope'" in proc.stderr
