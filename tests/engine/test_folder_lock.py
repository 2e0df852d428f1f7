"""One fedrift process at a time in a compare root or a run folder; a dead holder's lock is taken over."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedrift.cli import main
from fedrift.engine.folder_lock import LOCK_NAME, FolderInUse, FolderLock

FAST = ["data.name=digits", "model.name=logreg", "partition.num_clients=4", "partition.min_size=2",
        "train.rounds=1", "train.clients_per_round=2", "train.local_epochs=1", "output.progress=false",
        "engine.executor=sequential"]
HOLD = "import sys; from pathlib import Path; from fedrift.engine.folder_lock import FolderLock; " \
       "lock = FolderLock(Path(sys.argv[1]), 'x'); print('held', flush=True); sys.stdin.read()"


@pytest.fixture
def holder():
    """Start a live process holding a folder's lock; it lets go when the test ends."""
    procs = []

    def start(folder):
        folder.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _one_line_exit_2(capsys, args, *expect):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(e in err[0] for e in expect), err
    return err[0]


@pytest.mark.process
def test_a_compare_root_in_use_is_refused_then_free_when_its_holder_dies(capsys, tmp_path, holder):
    root = tmp_path / "conc"
    p = holder(root)
    args = ["compare", "--out", str(root), "--no-report", "seeds=0", *FAST]
    _one_line_exit_2(capsys, args, "--out", "in use by another fedrift process", f"pid {p.pid}")
    assert sorted(x.name for x in root.iterdir()) == [LOCK_NAME]  # nothing of the refused compare
    p.kill()
    p.wait()  # a killed holder leaves its lock file, with its pid, and no lock on it
    assert f"pid {p.pid}" in (root / LOCK_NAME).read_text()
    assert main(args) == 0
    assert not (root / LOCK_NAME).exists()  # released at the end


@pytest.mark.process
def test_a_run_folder_in_use_is_refused_even_with_overwrite(capsys, tmp_path, holder):
    out = tmp_path / "r"
    assert main(["run", *FAST, f"output.dir={out}"]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    holder(out)
    _one_line_exit_2(capsys, ["run", *FAST, f"output.dir={out}", "output.overwrite=true"], "output.dir", "in use")
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.name != LOCK_NAME} == before


def test_one_process_holds_a_folder_at_a_time(tmp_path):
    with FolderLock(tmp_path, "--out"):
        with pytest.raises(FolderInUse, match="in use"):
            FolderLock(tmp_path, "--out")  # another open file: refused, even in this process
    FolderLock(tmp_path, "--out").release()  # free again after release
