"""Run folders that cannot be turned against their owner (issue 68's F2, F3, F4, F13).

A run folder travels (tar, shared disks, a colleague's results): a link in it is refused,
never written through (F2); a resume runs only the experiment whose whole config the folder
holds (F3); overwrite removes only what fedrift made, in a folder it marked (F4); SIGTERM
stops a run as Ctrl-C does (F13). Each test failed on the code before these rules.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from conftest import ctrl_c_in_round, one_line_refusal
from fedrift import safe_files
from fedrift.cli import main
from fedrift.engine import outputs

FAST = ["data.name=digits", "model.name=mlp", "model.hidden=[16]", "partition.num_clients=4", "partition.min_size=2",
        "train.clients_per_round=2", "train.local_epochs=1", "output.progress=false", "engine.executor=sequential"]


def _run(folder: Path, *extra: str) -> list[str]:
    return ["run", *FAST, "train.rounds=2", f"output.dir={folder}", *extra]


def _stopped_run(tmp_path: Path, monkeypatch, capsys, name: str = "run") -> Path:
    """A run folder as Ctrl-C in round 3 leaves it: the checkpoint of round 2, summary interrupted."""
    run = tmp_path / name
    undo = ctrl_c_in_round(monkeypatch, 3)
    assert main(_run(run, "train.rounds=4", "engine.checkpoint_every=1")) == 130
    undo()
    assert (run / "checkpoint").is_dir()
    capsys.readouterr()
    return run


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("the owner's file\n")
    return victim


# -- the writing primitives ------------------------------------------------------------


def test_whole_files_and_appends_refuse_a_link_at_their_name(tmp_path):
    victim = _victim(tmp_path)
    for name, write in (("a", lambda p: safe_files.write_atomic(p, "x")), ("b", lambda p: safe_files.open_append(p)),
                        ("c", lambda p: safe_files.make_dir(p)), ("d", lambda p: safe_files.copy_file(victim, p))):
        link = tmp_path / name
        link.symlink_to(victim)
        with pytest.raises(safe_files.LinkRefused, match=f"{link} is a symbolic link"):
            write(link)
        assert link.is_symlink() and victim.read_text() == "the owner's file\n"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(safe_files.LinkRefused):
        safe_files.write_atomic(dangling, "x")
    assert not (tmp_path / "made-through-the-link").exists()


def test_a_whole_file_is_all_or_nothing(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with safe_files.atomic_file(path) as f:
            f.write(b"half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


# -- F2: links in a run folder ---------------------------------------------------------


def test_a_link_at_the_lock_is_refused_by_a_resume(capsys, tmp_path, monkeypatch):
    """F2: ``ln -s ~/x recv/.fedrift.lock``, ``fedrift run --resume recv`` overwrote ~/x."""
    run = _stopped_run(tmp_path, monkeypatch, capsys)
    victim = _victim(tmp_path)
    (run / ".fedrift.lock").symlink_to(victim)
    one_line_refusal(capsys, ["run", "--resume", str(run)], f"{run / '.fedrift.lock'} is a symbolic link")
    assert victim.read_text() == "the owner's file\n"


def test_a_link_at_clients_csv_is_refused_by_a_resume(capsys, tmp_path, monkeypatch):
    """The per-client rows (issue 71) are appended as metrics.jsonl is: never through a link."""
    run = _stopped_run(tmp_path, monkeypatch, capsys)
    victim = tmp_path / "elsewhere.csv"  # the same bytes, so only the link can stop the resume
    victim.write_bytes((run / "clients.csv").read_bytes())
    before = victim.read_bytes()
    (run / "clients.csv").unlink()
    (run / "clients.csv").symlink_to(victim)
    one_line_refusal(capsys, ["run", "--resume", str(run)], f"{run / 'clients.csv'} is a symbolic link")
    assert victim.read_bytes() == before


def test_a_link_at_a_run_subfolder_is_refused(capsys, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    one_line_refusal(capsys, _run(run, "output.tensorboard=true"), f"{run / 'tensorboard'} is a symbolic link")
    assert list(elsewhere.iterdir()) == []
    run = _stopped_run(tmp_path, monkeypatch, capsys, "stopped")  # a checkpoint folder made a link: the resume's next checkpoint is refused
    (run / "checkpoint").rename(elsewhere / "checkpoint")
    (run / "checkpoint").symlink_to(elsewhere / "checkpoint")
    before = sorted(p.name for p in (elsewhere / "checkpoint").iterdir())
    one_line_refusal(capsys, ["run", "--resume", str(run)], f"{run / 'checkpoint'} is a symbolic link")
    assert sorted(p.name for p in (elsewhere / "checkpoint").iterdir()) == before


def test_overwrite_removes_a_link_never_what_it_points_to(capsys, tmp_path):
    run = tmp_path / "run"
    assert main(_run(run)) == 0
    victim = _victim(tmp_path)
    for name in ("metrics.jsonl", "summary.json", "final_model.pt", "clients.csv"):
        (run / name).unlink()
        (run / name).symlink_to(victim)
    assert main(_run(run, "output.overwrite=true")) == 0
    assert victim.read_text() == "the owner's file\n"
    assert not any((run / n).is_symlink() for n in ("metrics.jsonl", "summary.json", "final_model.pt", "clients.csv"))


def test_a_link_at_a_report_file_is_refused(capsys, tmp_path):
    """F2: ``ln -s ~/y recv2/results.md``, ``fedrift report recv2`` wrote the table into ~/y."""
    root = tmp_path / "grid"
    assert main(["compare", *FAST, "train.rounds=2", "seeds=0", "--out", str(root), "--no-report"]) == 0
    victim = _victim(tmp_path)
    (root / "results.md").unlink(missing_ok=True)
    (root / "results.md").symlink_to(victim)
    capsys.readouterr()
    one_line_refusal(capsys, ["report", str(root), "report.plots=false"], f"{root / 'results.md'} is a symbolic link")
    assert victim.read_text() == "the owner's file\n"


# -- F3: a resume that only resumes ----------------------------------------------------


@pytest.mark.parametrize("text, said", [("", "is empty"), ("seed: 0\nplugins: []\ndata: {name: digits}\n", "has no partition section"),
                                        ("data: [unclosed\n", "is not valid YAML")])
def test_a_resume_refuses_a_config_that_is_not_whole(capsys, tmp_path, monkeypatch, text, said):
    """F3: a 0-byte config.yaml (a full disk) and ``--resume`` trained the default experiment
    (MNIST, CNN) into the folder without a word."""
    run = _stopped_run(tmp_path, monkeypatch, capsys)
    (run / "config.yaml").write_text(text)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    one_line_refusal(capsys, ["run", "--resume", str(run)], "--resume:", str(run / "config.yaml"), said)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_full_disk_never_leaves_a_torn_config(capsys, tmp_path, monkeypatch):
    """F3's cause: config.yaml is renamed into place whole, so a full disk leaves none, and the
    refusal that follows never suggests --resume."""
    run = tmp_path / "run"
    real_temp = safe_files._temp_beside

    def full(path, mode):
        tmp, fd = real_temp(path, mode)
        if path.name == "config.yaml":
            os.dup2(os.open("/dev/full", os.O_WRONLY), fd)
        return tmp, fd

    monkeypatch.setattr(safe_files, "_temp_beside", full)
    one_line_refusal(capsys, _run(run), "No space left on device")
    monkeypatch.undo()
    assert not (run / "config.yaml").exists()
    line = one_line_refusal(capsys, _run(run), f"output.dir: {str(run)!r}")
    assert "--resume" not in line
    one_line_refusal(capsys, ["run", "--resume", str(run)], "holds no run (no config.yaml)")


# -- F4: overwrite removes only what fedrift made --------------------------------------


def test_overwrite_keeps_what_fedrift_did_not_make(capsys, tmp_path):
    """F4: overwrite deleted a user's checkpoint/epoch50.ckpt with fedrift's checkpoint/."""
    run = tmp_path / "run"
    assert main(_run(run, "train.rounds=3", "engine.checkpoint_every=1", "output.tensorboard=true")) == 0
    assert (run / outputs.MARK).is_file()
    (run / "checkpoint").mkdir(exist_ok=True)
    (run / "checkpoint" / "epoch50.ckpt").write_text("weeks of training\n")
    (run / "tensorboard" / "events.out.tfevents.1.other").write_text("another program's events\n")
    (run / "notes.txt").write_text("mine\n")
    assert main(_run(run, "output.overwrite=true", "output.tensorboard=true")) == 0
    assert (run / "checkpoint" / "epoch50.ckpt").read_text() == "weeks of training\n"
    assert (run / "tensorboard" / "events.out.tfevents.1.other").is_file()
    assert (run / "notes.txt").read_text() == "mine\n"
    assert json.loads((run / "summary.json").read_text())["rounds"] == 2  # the new run's


def test_overwrite_refuses_a_folder_fedrift_did_not_make(capsys, tmp_path, monkeypatch):
    """F4: ``output.dir=victim output.overwrite=true`` deleted the user's files of fedrift's names."""
    victim = tmp_path / "victim"
    (victim / "checkpoint").mkdir(parents=True)
    (victim / "checkpoint" / "epoch50.ckpt").write_text("weeks of training\n")
    (victim / "config.yaml").write_text("my own config\n")
    before = sorted(str(p) for p in victim.rglob("*"))
    one_line_refusal(capsys, _run(victim, "output.overwrite=true"), f"{str(victim)!r} holds files but no .fedrift-run mark")
    assert sorted(str(p) for p in victim.rglob("*")) == before
    assert (victim / "config.yaml").read_text() == "my own config\n"
    home = tmp_path / "home"
    home.mkdir()
    (home / "metrics.jsonl").write_text("{}\n")
    (home / outputs.MARK).write_text("{}\n")  # even marked, the home folder is never cleared
    monkeypatch.setenv("HOME", str(home))
    one_line_refusal(capsys, _run(home, "output.overwrite=true"), "is the home folder, which fedrift never clears")
    assert (home / "metrics.jsonl").read_text() == "{}\n"


def test_tensorboard_keeps_event_files_fedrift_did_not_write(capsys, tmp_path):
    """F4: ``output.tensorboard=true`` deleted an older events file in tensorboard/ (no overwrite asked)."""
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    older = run / "tensorboard" / "events.out.tfevents.1700000000.host.1.0"
    older.write_text("an earlier experiment's curves\n")
    assert main(_run(run, "output.tensorboard=true")) == 0
    assert older.read_text() == "an earlier experiment's curves\n"
    assert list((run / "tensorboard").glob("*.fedrift"))


# -- F13: SIGTERM ----------------------------------------------------------------------


def test_sigterm_stops_a_run_as_ctrl_c_does(capsys, tmp_path, monkeypatch):
    """F13: ``kill -TERM`` mid-run gave exit 143 with no line and no summary; now the run stops
    as at Ctrl-C (summary interrupted, checkpoint kept, a line naming the resume), exit 143."""
    run = tmp_path / "run"
    log = outputs.RunWriter.log

    def term_in_round_3(self, row):
        log(self, row)
        if row["round"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # to this process: the CLI's handler stops the run

    monkeypatch.setattr(outputs.RunWriter, "log", term_in_round_3)
    before = signal.getsignal(signal.SIGTERM)
    assert main(_run(run, "train.rounds=6", "engine.checkpoint_every=2")) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedrift: stopped by SIGTERM:") and "--resume" in err[0], err
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    assert main(["run", "--resume", str(run)]) == 0
    assert "continued from the checkpoint of round 2" in capsys.readouterr().out


def test_a_link_at_a_tunes_study_database_is_refused(capsys, tmp_path):
    """Optuna's sqlite would write through a link at ``study.db`` (its path was resolved, the
    link followed): refused like any other file of the folder."""
    root = tmp_path / "tune"
    root.mkdir()
    victim = _victim(tmp_path)
    (root / "study.db").symlink_to(victim)
    tune = [a for a in FAST if not a.startswith("output.")]
    one_line_refusal(capsys, ["tune", *tune, "train.rounds=2", "partition.val_share=0.2", "algorithms=fedavg", "--trials", "1",
                              "--out", str(root)],
                     f"{root / 'study.db'} is a symbolic link")
    assert victim.read_text() == "the owner's file\n"
