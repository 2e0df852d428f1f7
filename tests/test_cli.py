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
        ("engine.checkpoint_every=-1", "engine.checkpoint_every", "greater than or equal to 0"),
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


@pytest.mark.process
def test_console_script_exit_status(tmp_path):
    """The installed entry point, as a user runs it: exit 2 and no traceback."""
    exe = Path(sys.executable).with_name("fedrift")
    proc = subprocess.run([str(exe), "run", "algorithm.name=nope"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unknown algorithm 'nope'" in proc.stderr


def test_ctrl_c_then_report_then_resume(capsys, tmp_path, monkeypatch):
    """Ctrl-C in round 3 (checkpoint of round 2): exit 130 and a message saying how to go on;
    an `interrupted` summary that `fedrift report` shows; a rerun into the folder is pointed to
    --resume, which continues the run."""
    import json

    from conftest import ctrl_c_in_round

    run = tmp_path / "run"
    args = ["run", *FAST, "train.rounds=4", "engine.checkpoint_every=2", f"output.dir={run}"]
    undo = ctrl_c_in_round(monkeypatch, 3)
    assert main(args) == 130
    err = capsys.readouterr().err.strip()
    assert err == (f"fedrift: interrupted in round 3 (metrics up to round 2 kept in {run / 'metrics.jsonl'}); "
                   f"continue with: fedrift run --resume {run}; it continues from the checkpoint of round 2")
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["rounds"], summary["rounds_planned"]) == ("interrupted", 2, 4)
    undo()

    assert main(["report", str(tmp_path), "report.plots=false"]) == 0
    out = capsys.readouterr().out
    assert f"{run}: interrupted after round 2; continue with: fedrift run --resume {run}" in out
    assert "0/1 (1 interrupted at round 2)" in out

    line = _fails(capsys, args, "output.dir")
    assert f"holds a run that was interrupted after round 2; continue it with fedrift run --resume {run}" in line
    _fails(capsys, ["run", "-c", "x.yaml", "--resume", str(run)], "--resume")
    line = _fails(capsys, ["run", "--resume", str(run), "train.lr=0.5"], "the checkpoint is of another config")
    assert "(train.lr: 0.05 there, 0.5 here)" in line

    assert main(["run", "--resume", str(run), "output.progress=false"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("continued from the checkpoint of round 2\n")
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert [json.loads(x)["round"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    _fails(capsys, ["run", "--resume", str(run)], "nothing to continue")


def test_a_relative_data_root_is_stored_absolute_so_a_resume_works_from_another_folder(tmp_path, capsys, monkeypatch):
    """data.root=arrays (relative) in the run folder's config.yaml as the absolute path it
    meant; --resume from another folder, where 'arrays' is not, continues the run."""
    import json

    import numpy as np
    import yaml

    from conftest import ctrl_c_in_round

    rng = np.random.default_rng(0)
    data = tmp_path / "project" / "arrays"
    data.mkdir(parents=True)
    np.savez(data / "a.npz", x_train=rng.normal(size=(80, 8)).astype(np.float32), y_train=rng.integers(0, 4, 80),
             x_test=rng.normal(size=(20, 8)).astype(np.float32), y_test=rng.integers(0, 4, 20))
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "project")
    undo = ctrl_c_in_round(monkeypatch, 2)
    assert main(["run", *FAST, "data.name=npz", "data.root=arrays", "train.rounds=3", "engine.checkpoint_every=1",
                 f"output.dir={run}"]) == 130
    undo()
    root = yaml.safe_load((run / "config.yaml").read_text())["data"]["root"]
    assert os.path.isabs(root) and os.path.samefile(root, data), root
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["run", "--resume", str(run)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("continued from the checkpoint of round 1\n")
    # a run stopped before roots were stored absolute: its config.yaml and checkpoint hold the
    # relative root; resumed from the folder it names the same data from, it continues
    from fedrift.engine.checkpoint import MANIFEST, fingerprint

    old = tmp_path / "old"
    monkeypatch.chdir(tmp_path / "project")
    undo = ctrl_c_in_round(monkeypatch, 2)
    assert main(["run", *FAST, "data.name=npz", "data.root=arrays", "train.rounds=3", "engine.checkpoint_every=1",
                 f"output.dir={old}"]) == 130
    undo()
    (old / "config.yaml").write_text((old / "config.yaml").read_text().replace(str(data), "arrays"))
    manifest = json.loads((old / "checkpoint" / MANIFEST).read_text())
    manifest["config"]["data.root"] = "arrays"
    manifest["fingerprint"] = fingerprint(manifest["config"])
    (old / "checkpoint" / MANIFEST).write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["run", "--resume", str(old)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("continued from the checkpoint of round 1\n")

    # ~ stays as written: the same folder wherever the command runs
    from fedrift.config import absolute_root

    assert absolute_root("~/data") == "~/data" and absolute_root("/data") == "/data"
    assert absolute_root("data") == os.path.join(os.getcwd(), "data")


@pytest.mark.process
def test_a_real_ctrl_c_writes_an_interrupted_summary_and_says_how_to_continue(tmp_path):
    """SIGINT (what Ctrl-C sends) to a real `fedrift run` mid-run: exit 130, the interrupted
    summary with the rounds done, and the --resume command on stderr."""
    import json
    import signal
    import time

    run = tmp_path / "run"
    # A terminal's foreground job: SIGINT at its default and not blocked. A child inherits an
    # ignored SIGINT (what a shell gives a background job; Python then leaves Ctrl-C off) and
    # the spawning thread's signal mask; the suite's process is no terminal and a library it
    # ran may have changed either, so the child is started as a terminal would start it.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fedrift.cli", "run", *FAST, "train.rounds=100000",
                                 "engine.checkpoint_every=1", "engine.executor=sequential", f"output.dir={run}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, before)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while (not metrics.is_file() or metrics.read_text().count("\n") < 2) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # say how the child held SIGINT (bit 2 of the masks), then stop it
        status = [ln for ln in open(f"/proc/{proc.pid}/status").read().splitlines() if ln.startswith("Sig")]
        proc.kill()
        raise AssertionError(f"the run did not stop on SIGINT; its signal masks: {status}") from None
    assert proc.returncode == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] >= 2
    assert "Traceback" not in err and f"continue with: fedrift run --resume {run}" in err


def test_version_prints_fedrift_s_version(capsys):
    from fedrift.version import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"fedrift {__version__}\n"


def test_the_usage_line_names_every_command(capsys):
    """``fedrift --help``'s usage line lists each command (it left out ``select`` once, issue 52)."""
    from fedrift.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    for command in ("run", "config", "compare", "tune", "select", "study", "report", "list", "partition", "download",
                    "flower"):
        assert command in usage.split("{")[1].split("}")[0].split(","), (command, usage)


def test_config_show_prints_the_resolved_config_that_run_takes_back(capsys, tmp_path):
    """``fedrift config show`` (the defaults, or -c FILE, with overrides): every section's options
    resolved, as YAML that ``fedrift run -c`` takes back; the run's own config.yaml is the same text."""
    import yaml

    run_dir = tmp_path / "r"
    assert main(["config", "show", *FAST, "algorithm.name=fedprox", f"output.dir={run_dir}"]) == 0
    shown = capsys.readouterr().out
    doc = yaml.safe_load(shown)
    assert doc["algorithm"]["name"] == "fedprox" and "mu" in doc["algorithm"]  # the algorithm's default, resolved
    assert doc["model"]["name"] == "logreg" and doc["train"]["rounds"] == 1
    (tmp_path / "shown.yaml").write_text(shown)
    assert main(["config", "show", "-c", str(tmp_path / "shown.yaml")]) == 0
    assert capsys.readouterr().out == shown  # a fixed point: nothing left to resolve
    assert main(["run", "-c", str(tmp_path / "shown.yaml")]) == 0
    assert (run_dir / "config.yaml").read_text() == shown
    assert not (tmp_path / "runs").exists()  # config show wrote nothing
    # the defaults alone; a bad key is one line, exit 2
    assert main(["config", "show"]) == 0 and "name: fedavg" in capsys.readouterr().out
    _fails(capsys, ["config", "show", "algorithm.mu=0.1"], "algorithm.mu")


def test_config_alone_prints_what_config_show_prints(capsys):
    """``fedrift config`` with no sub-command prints the defaults as ``config show`` does
    (it failed with 'the following arguments are required: {show}', issue 72)."""
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert main(["config", "show"]) == 0 and capsys.readouterr().out == out
    assert "name: fedavg" in out


def _commands(parser, prefix="fedrift"):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from _commands(sub, f"{prefix} {name}")


def test_every_command_says_what_it_does_in_its_help():
    """Each subcommand's --help has a description (``run --help`` had none, issue 51)."""
    from fedrift.cli import _parser

    commands = dict(_commands(_parser()))
    assert {"fedrift run", "fedrift config show", "fedrift select", "fedrift study status"} <= set(commands)
    for name, sub in commands.items():
        assert sub.description and len(sub.description.split()) >= 8, name
        assert " ".join(sub.description.split()) in " ".join(sub.format_help().split()), name


def test_optunas_experimental_warning_is_silenced_and_nothing_else():
    """select's sampler uses TPE's experimental ``group`` option: Optuna's ExperimentalWarning
    about it is not printed; other warnings still are (no global ignore)."""
    import warnings

    from fedrift.experiments.studies import load_optuna

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optuna = load_optuna()
        optuna.samplers.TPESampler(seed=0, multivariate=True, group=True, constant_liar=True)
        warnings.warn("a warning of someone else's", UserWarning)
    assert [str(w.message) for w in caught] == ["a warning of someone else's"], [str(w.message) for w in caught]
