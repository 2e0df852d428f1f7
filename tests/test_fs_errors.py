"""File-system errors are input errors: a folder that cannot be created or written, a full
disk while a run writes, a report folder that cannot be written: one line, exit 2, and what
was written before is kept. Tests may run as root, where permission bits stop nothing, so
the folders are /proc paths (no one may create files there) and the full disk is /dev/full
(the kernel's ENOSPC) or a write made to fail in this process."""

import errno
import json
import os
from pathlib import Path

import pytest

from conftest import one_line_refusal
from fedrift.cli import main
from fedrift import safe_files
from fedrift.engine import checkpoint, outputs

FAST = ["data.name=digits", "model.name=mlp", "model.hidden=[16]", "partition.num_clients=4", "partition.min_size=2",
        "train.clients_per_round=2", "train.local_epochs=1", "output.progress=false", "engine.executor=sequential"]


def _rounds(run: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_an_output_folder_that_cannot_be_created(capsys):
    one_line_refusal(capsys, ["run", *FAST, "train.rounds=1", "output.dir=/proc/fedrift-x/run"],
              "output.dir: cannot create or write /proc/fedrift-x", "allowed: a folder this user can create and write")
    one_line_refusal(capsys, ["partition", "data.name=digits", "--out", "/proc/fedrift-x"], "--out: cannot create or write /proc/fedrift-x")
    one_line_refusal(capsys, ["compare", *FAST, "train.rounds=1", "--out", "/proc/fedrift-x"], "--out: cannot create or write /proc/fedrift-x")


def test_an_output_folder_that_cannot_be_written(capsys, tmp_path):
    """/proc/self exists but takes no new files, as a read-only folder (also for root)."""
    one_line_refusal(capsys, ["run", *FAST, "train.rounds=1", "output.dir=/proc/self"], "output.dir: cannot create or write /proc/self/")
    if os.geteuid() != 0:  # where permission bits do stop writes, a folder without write permission too
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        one_line_refusal(capsys, ["run", *FAST, "train.rounds=1", f"output.dir={locked}"], "Permission denied")


class _FullDiskAfter:
    """metrics.jsonl's file, full from its ``lines``-th line on: ``part`` bytes of that line
    reach the file, then the write fails with ENOSPC (a partly written line)."""

    def __init__(self, real, lines: int, part: int) -> None:
        self.real, self.lines, self.part = real, lines, part

    def write(self, data) -> int:
        if self.lines > 0:
            self.lines -= 1
            return self.real.write(data)
        self.real.write(bytes(data[: self.part]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("part", [0, 7])
def test_a_full_disk_while_writing_metrics_keeps_the_earlier_rounds(capsys, tmp_path, monkeypatch, part):
    """The disk fills in round 3 (of 4; a checkpoint after round 2): one line naming the file,
    the reason and how to continue; metrics.jsonl holds exactly rounds 1-2 (a partly written
    line is cut off); with space again, --resume finishes the run."""
    init = outputs.RunWriter.__init__

    def full_from_round_3(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._metrics = _FullDiskAfter(self._metrics, 2, part)

    monkeypatch.setattr(outputs.RunWriter, "__init__", full_from_round_3)
    run = tmp_path / "run"
    args = ["run", *FAST, "train.rounds=4", "engine.checkpoint_every=2", f"output.dir={run}"]
    one_line_refusal(capsys, args, f"output.dir: cannot write {run / 'metrics.jsonl'} (No space left on device) at round 3",
              "keeps rounds up to 2", f"continue with: fedrift run --resume {run}")
    assert _rounds(run) == [1, 2]
    assert (run / "config.yaml").is_file() and (run / "partition.json").is_file()
    monkeypatch.setattr(outputs.RunWriter, "__init__", init)  # space again
    assert main(["run", "--resume", str(run)]) == 0
    assert _rounds(run) == [1, 2, 3, 4]


def test_the_kernels_full_disk(capsys, tmp_path, monkeypatch):
    """/dev/full: every write fails with the kernel's own ENOSPC (from round 2 here)."""
    log = outputs.RunWriter.log

    def full_from_round_2(self, row):
        if row["round"] == 2:
            self._metrics.close()
            self._metrics = open("/dev/full", "ab", buffering=0)
        log(self, row)

    monkeypatch.setattr(outputs.RunWriter, "log", full_from_round_2)
    run = tmp_path / "run"
    one_line_refusal(capsys, ["run", *FAST, "train.rounds=3", f"output.dir={run}"], "(No space left on device) at round 2")
    assert _rounds(run) == [1]


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_last_whole_one(capsys, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_temp = safe_files._temp_beside

    def full_at_round_4(path, mode):
        if "state-r000004" in str(path):  # the file's writes go to the full device
            tmp, fd = real_temp(path, mode)
            os.dup2(os.open("/dev/full", os.O_WRONLY), fd)
            return tmp, fd
        return real_temp(path, mode)

    monkeypatch.setattr(safe_files, "_temp_beside", full_at_round_4)  # where every whole file starts
    one_line_refusal(capsys, ["run", *FAST, "train.rounds=5", "engine.checkpoint_every=2", f"output.dir={run}"],
              f"output.dir: cannot write {run / 'checkpoint'} (No space left on device)",
              "the last whole checkpoint is kept", "--resume")
    manifest = json.loads((run / "checkpoint" / checkpoint.MANIFEST).read_text())
    assert manifest["round"] == 2 and not list((run / "checkpoint").glob("*.tmp"))
    assert _rounds(run) == [1, 2, 3, 4]
    monkeypatch.undo()
    assert main(["run", "--resume", str(run)]) == 0
    assert _rounds(run) == [1, 2, 3, 4, 5]


def test_report_on_a_folder_that_cannot_be_written(capsys, tmp_path, monkeypatch):
    """A read-only run folder given to fedrift report (made read-only in this process, as
    root may write anywhere): one line, exit 2, the runs unchanged."""
    root = tmp_path / "grid"
    assert main(["compare", *FAST, "train.rounds=2", "seeds=0", "--out", str(root), "--no-report"]) == 0
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    real_temp = safe_files._temp_beside

    def read_only(path, mode):
        if Path(path).is_relative_to(root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_temp(path, mode)

    monkeypatch.setattr(safe_files, "_temp_beside", read_only)  # where every whole file starts
    capsys.readouterr()
    one_line_refusal(capsys, ["report", str(root), "report.plots=false"],
              f"report: cannot write {root / 'results.csv'} (Read-only file system)", f"the runs in {root} are unchanged")
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
