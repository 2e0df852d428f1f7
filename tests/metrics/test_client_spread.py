"""Per-client local accuracy (``fedrift.metrics.client_spread``): the spread beside
``local_accuracy`` in ``metrics.jsonl`` and ``summary.json``, and ``clients.csv``, the counts it
is made from (a row a client a scored model an evaluated round)."""

from __future__ import annotations

import csv
import dataclasses
import errno
import json
import math
import os

import numpy as np
import pytest
import torch

import fedrift
from agreement import BITS, agree
from conftest import ctrl_c_in_round
from fedrift.api import prepare, run_prepared
from fedrift.engine import outputs, server
from fedrift.engine.checkpoint import CheckpointError
from fedrift.errors import ConfigError, OutputError
from fedrift.metrics.client_spread import SPREAD, ClientScores, accuracies, client_counts, client_spread
from fedrift.metrics.evaluate import LocalParts, evaluate


def _scores(correct, n_test) -> ClientScores:
    return ClientScores(torch.tensor(n_test, dtype=torch.long), torch.tensor(correct, dtype=torch.long))


def _rows(run_dir) -> list[dict]:
    with open(run_dir / "clients.csv", newline="") as f:
        return [{k: v if k == "model" else int(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# -- the statistics, by hand -------------------------------------------------------------


def test_ten_clients_worst10_is_the_worst_one_and_best10_the_best():
    """Accuracies 0.0, 0.1, ..., 0.9 (client k: k right of 10): ceil(10/10) = 1 client each way."""
    row = client_spread(_scores(list(range(10)), [10] * 10), "a")
    assert row["a"] == pytest.approx(0.45, abs=1e-15)
    assert row["a_worst"] == 0.0 and row["a_worst10"] == 0.0 and row["a_best10"] == 0.9
    assert row["a_std"] == pytest.approx(math.sqrt(sum((k / 10 - 0.45) ** 2 for k in range(10)) / 10), abs=1e-15)
    jain = sum(k / 10 for k in range(10)) ** 2 / (10 * sum((k / 10) ** 2 for k in range(10)))
    assert row["a_jain"] == pytest.approx(jain, abs=1e-15) and set(row) == {"a", *(f"a_{s}" for s in SPREAD)}


def test_twenty_clients_take_the_mean_of_two_and_eleven_of_two():
    """20 clients: the worst 10% is the 2 worst; 11 clients: ceil(1.1) = 2 too (at least 10%)."""
    correct = [3, 1, 9, 9, 4] + [5] * 15  # out of 10: 0.1 and 0.3 worst, 0.9 and 0.9 best (a tie)
    row = client_spread(_scores(correct, [10] * 20), "a")
    assert row["a_worst"] == 0.1 and row["a_worst10"] == pytest.approx(0.2, abs=1e-15)
    assert row["a_best10"] == 0.9
    row = client_spread(_scores([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10], [10] * 11), "a")
    assert row["a_worst10"] == pytest.approx(0.15, abs=1e-15) and row["a_best10"] == 1.0


def test_ties_at_the_cut_give_the_same_mean_whichever_client_is_taken():
    row = client_spread(_scores([2, 2, 2, 8, 8, 8, 8, 8, 8, 8, 8, 8], [10] * 12), "a")  # 12 clients: 2 each way
    assert row["a_worst"] == row["a_worst10"] == 0.2 and row["a_best10"] == 0.8


def test_jain_index_at_its_ends():
    assert client_spread(_scores([7, 7, 7], [10, 10, 10]), "a")["a_jain"] == pytest.approx(1.0, abs=1e-15)
    assert client_spread(_scores([10, 0, 0, 0], [10] * 4), "a")["a_jain"] == 0.25  # one client has it all: 1/n
    assert client_spread(_scores([0, 0], [5, 5]), "a")["a_jain"] == 1.0  # all equal (at zero)
    one = client_spread(_scores([3], [4]), "a")
    assert one["a_std"] == 0.0 and one["a_worst"] == one["a_worst10"] == one["a_best10"] == one["a"] == 0.75


def test_clients_without_test_samples_are_left_out_and_counted():
    s = _scores([3, 0, 1, 0], [4, 0, 2, 0])
    assert accuracies(s).tolist() == [0.75, 0.5]
    row = client_spread(s, "a")
    assert row["a"] == 0.625 and row["a_worst"] == 0.5  # not 0: an empty split has no accuracy
    assert client_counts(s) == {"local_clients": 2, "local_clients_without_test": 2}
    assert client_spread(_scores([0, 0], [0, 0]), "a") == {}
    assert client_spread(s, "a", spread=False) == {"a": 0.625}


def test_evaluate_reports_the_spread_and_the_counts_it_comes_from():
    """A model answering 0 on y = 0 0 1 1 0, clients owning {0}, {}, {1, 2, 3}, {3, 4}: 1, -, 1/3, 1/2."""

    def apply(params, x):
        return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.int64), 2).float()

    x, y = torch.zeros(5, 1), torch.tensor([0, 0, 1, 1, 0])
    empty = torch.tensor([], dtype=torch.int64)
    parts = LocalParts([torch.tensor([0]), empty, torch.tensor([1, 2, 3]), torch.tensor([3, 4])])
    scores: dict[str, ClientScores] = {}
    row = evaluate(apply, {}, x, y, batch_size=2, local=parts, scores=scores)
    assert scores[""].n_test.tolist() == [1, 0, 3, 2] and scores[""].correct.tolist() == [1, 0, 1, 1]
    assert row["local_accuracy"] == pytest.approx((1 + 1 / 3 + 1 / 2) / 3, abs=1e-15)
    assert row["local_accuracy_worst"] == 1 / 3 and row["local_accuracy_best10"] == 1.0
    assert row["local_clients"] == 3 and row["local_clients_without_test"] == 1
    val = evaluate(apply, {}, x, y, batch_size=2, prefix="val", local=parts)
    assert "val_local_accuracy" in val and not any(k.startswith("val_local_accuracy_") for k in val)  # no spread there
    assert "local_clients" not in val


# -- a run's clients.csv -------------------------------------------------------------------


def test_the_file_holds_the_accuracies_whose_mean_is_local_accuracy(tiny, tmp_path):
    """A global model (FedAvg) with one client's local test split emptied: every evaluated
    round's rows give, client by client, the final model's own count on its split (recomputed
    here from final_model.pt), and local_accuracy and its spread are made of exactly them."""
    cfg = tiny(train={"rounds": 3}, eval={"every": 2}, output={"dir": str(tmp_path / "run"), "progress": False})
    prep = prepare(cfg)
    test = [np.asarray(prep.partition.test[k]) for k in range(prep.partition.num_clients)]
    test[4] = np.zeros(0, dtype=np.int64)
    prep = dataclasses.replace(prep, partition=dataclasses.replace(prep.partition, test=test))
    result = run_prepared(prep)
    rows, metrics = _rows(result.output_dir), _metrics(result.output_dir)
    assert [m["round"] for m in metrics] == [2, 3] and sorted({r["round"] for r in rows}) == [2, 3]
    assert {r["model"] for r in rows} == {"global"}
    for m in metrics:
        mine = [r for r in rows if r["round"] == m["round"]]
        assert [r["client"] for r in mine] == [0, 1, 2, 3, 5]  # client 4 has no test sample: left out
        assert [r["n_test"] for r in mine] == [len(test[k]) for k in (0, 1, 2, 3, 5)]
        again = client_spread(_scores([r["correct"] for r in mine], [r["n_test"] for r in mine]), "local_accuracy")
        assert again == {k: m[k] for k in again}  # the very numbers, to the bit
        assert m["local_clients"] == 5 and m["local_clients_without_test"] == 1
    summary = result.summary
    assert all(summary[f"final_local_accuracy_{s}"] == metrics[-1][f"local_accuracy_{s}"] for s in SPREAD)

    from fedrift.models import build_model

    model = build_model("mlp", prep.options["model"], prep.dataset.input_shape, prep.dataset.num_classes, 0)
    model.load_state_dict(torch.load(result.output_dir / "final_model.pt"))
    with torch.no_grad():
        right = model(prep.dataset.x_test.float()).argmax(1) == prep.dataset.y_test
    last = [r for r in rows if r["round"] == 3]
    assert [r["correct"] for r in last] == [int(right[torch.as_tensor(test[k])].sum()) for k in (0, 1, 2, 3, 5)]


def test_a_personal_model_algorithm_records_its_clients_own_models(tiny, tmp_path, monkeypatch):
    """FedProto: the rows are each panel client's own model on its own split (``personal``,
    and ``personal_proto`` for the nearest-prototype predictor), counted here again from the
    models the server evaluated in the last round."""
    seen: list = []
    real = server.evaluate_personal

    def record(apply, models, local, x, y, *args, **kwargs):
        models = list(models)
        if kwargs.get("scores") is not None:  # the test split
            seen[:] = [int((apply(p, x[ix]).argmax(1) == y[ix]).sum()) for p, ix in zip(models, local)]
        return real(apply, models, local, x, y, *args, **kwargs)

    monkeypatch.setattr(server, "evaluate_personal", record)
    r = fedrift.run(tiny(algorithm={"name": "fedproto", "lam": 1.0}, train={"rounds": 2}))
    rows, last = _rows(r.output_dir), _metrics(r.output_dir)[-1]
    assert {row["model"] for row in rows} == {"personal", "personal_proto"}
    mine = [row for row in rows if row["round"] == 2 and row["model"] == "personal"]
    assert [row["correct"] for row in mine] == seen and len(seen) == 6
    for model, key in (("personal", "local_accuracy"), ("personal_proto", "local_accuracy_proto")):
        mine = [row for row in rows if row["round"] == 2 and row["model"] == model]
        again = client_spread(_scores([x["correct"] for x in mine], [x["n_test"] for x in mine]), key)
        assert again == {k: last[k] for k in again}
    assert r.summary["final_local_accuracy_worst10"] == last["local_accuracy_worst10"]


def test_fedbn_records_each_clients_model_and_ccvr_its_calibrated_one(tiny, tmp_path):
    bn = fedrift.run(tiny(algorithm={"name": "fedbn"}, model={"name": "resnet8", "width": 4, "norm": "batch"},
                          output={"dir": str(tmp_path / "bn"), "progress": False}))
    assert {row["model"] for row in _rows(bn.output_dir)} == {"personal"}
    ccvr = {"name": "ccvr", "M": 40, "epochs": 2, "calibrate_at": "every"}  # calibrated at every evaluated round
    cal = fedrift.run(tiny(algorithm=ccvr, output={"dir": str(tmp_path / "cal"), "progress": False}))
    rows, last = _rows(cal.output_dir), _metrics(cal.output_dir)[-1]
    assert {row["model"] for row in rows if row["round"] == 2} == {"global", "calibrated"}
    mine = [row for row in rows if row["round"] == 2 and row["model"] == "calibrated"]
    again = client_spread(_scores([x["correct"] for x in mine], [x["n_test"] for x in mine]), "calibrated_local_accuracy")
    assert again == {k: last[k] for k in again}
    assert cal.summary["calibrated_local_accuracy_jain"] == last["calibrated_local_accuracy_jain"]


# -- stops, resumes, a full disk -----------------------------------------------------------


def _cfg(tiny, tmp_path, folder, every):
    return tiny(train={"rounds": 4}, engine={"executor": "sequential", "checkpoint_every": every},
                output={"dir": str(tmp_path / folder), "progress": False})


@pytest.mark.agreement
def test_a_resumed_run_writes_the_same_file_as_the_uninterrupted_one(tiny, tmp_path, monkeypatch):
    """Ctrl-C in round 3's metrics line (its clients rows written just before it): the stop
    cuts them, so the file holds rounds 1-2 as metrics.jsonl does; rows a kill would have left
    after the checkpoint are cut on resume; the resumed file is the uninterrupted one, byte for byte."""
    whole = fedrift.run(_cfg(tiny, tmp_path, "whole", 0))
    undo = ctrl_c_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fedrift.run(_cfg(tiny, tmp_path, "stopped", 2))
    undo()
    stopped = tmp_path / "stopped"
    assert {r["round"] for r in _rows(stopped)} == {1, 2} == {m["round"] for m in _metrics(stopped)}
    with open(stopped / "clients.csv", "a") as f:  # as a kill between round 3's rows and its line leaves them
        f.write("3,0,global,79,1\n")
    resumed = fedrift.resume(stopped)
    assert resumed.summary["resumed_from_round"] == 2
    agree((whole.output_dir / "clients.csv").read_text(), (stopped / "clients.csv").read_text(), BITS)


def test_a_file_changed_before_the_checkpoint_is_refused(tiny, tmp_path, monkeypatch):
    undo = ctrl_c_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fedrift.run(_cfg(tiny, tmp_path, "stopped", 2))
    undo()
    path = tmp_path / "stopped" / "clients.csv"
    text = path.read_text().splitlines(keepends=True)
    path.write_text(text[0] + text[1].replace(",global,", ",personal,", 1) + "".join(text[2:]))
    with pytest.raises(CheckpointError, match="clients.csv: its first"):
        fedrift.resume(tmp_path / "stopped")


class _FullDisk:
    """A file whose writes fail (ENOSPC) once ``ok`` writes went through, after ``part`` bytes."""

    def __init__(self, real, ok: int, part: int) -> None:
        self.real, self.ok, self.part = real, ok, part

    def write(self, data) -> int:
        if self.ok > 0:
            self.ok -= 1
            return self.real.write(data)
        self.real.write(bytes(data[: self.part]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.agreement
def test_a_full_disk_while_writing_the_rows_keeps_the_earlier_rounds(tiny, tmp_path, monkeypatch):
    """The disk fills in round 3's rows: one OutputError naming clients.csv; both files hold
    exactly rounds 1-2; with space again the resume ends with the uninterrupted run's file."""
    whole = fedrift.run(_cfg(tiny, tmp_path, "whole", 0))
    real = outputs.open_append

    def full(path, buffering=-1):
        f = real(path, buffering)
        return _FullDisk(f, 2, 9) if path.name == "clients.csv" else f

    monkeypatch.setattr(outputs, "open_append", full)
    with pytest.raises(OutputError, match=r"clients\.csv \(No space left on device\) at round 3"):
        fedrift.run(_cfg(tiny, tmp_path, "full", 2))
    monkeypatch.setattr(outputs, "open_append", real)
    run = tmp_path / "full"
    assert {r["round"] for r in _rows(run)} == {1, 2} == {m["round"] for m in _metrics(run)}
    fedrift.resume(run)
    agree((whole.output_dir / "clients.csv").read_text(), (run / "clients.csv").read_text(), BITS)


def test_a_folder_holding_a_clients_file_is_a_run_folder(tiny, tmp_path):
    """Appended like metrics.jsonl, so never added to: a folder that holds one is refused, and
    overwrite (in a folder fedrift marked) removes it."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "clients.csv").write_text("my own\n")
    with pytest.raises(ConfigError, match=r"already holds a run \(clients.csv\)"):
        fedrift.run(tiny(output={"dir": str(folder), "progress": False}))
    assert (folder / "clients.csv").read_text() == "my own\n"
    first = fedrift.run(tiny(train={"rounds": 1}, output={"dir": str(tmp_path / "run"), "progress": False}))
    again = fedrift.run(tiny(train={"rounds": 1},
                             output={"dir": str(tmp_path / "run"), "progress": False, "overwrite": True}))
    assert _rows(again.output_dir) == _rows(first.output_dir) and {r["round"] for r in _rows(again.output_dir)} == {1}
