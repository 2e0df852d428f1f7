"""Bad input, tried by machine: hypothesis generates configs (wrong types, out-of-range values,
unknown keys, impossible combinations) and sends each through ``fedrift run`` and ``fedrift
compare`` in this process; corrupted run folders go to ``fedrift report`` and ``--resume``.

Every case must end in one of two ways: refused (exit 2, one line on stderr that names a
config key or the file at fault, no traceback, nothing written: the run folder or the grid's
``--out`` does not exist afterwards), or accepted, which the test sees when the run reaches
the round loop (replaced here by a stub that stops it: training is not what is tested).
Anything else (another exception, another exit status, a second line) fails the test.

Generated cases per run of the suite (hypothesis, derandomized, so CI tries the same ones):
500 through ``fedrift run`` (half as YAML files, half as ``key=value`` overrides), 200 through
``fedrift compare``, and 60 corrupted run folders each through ``report`` and ``--resume``:
760 in all (about 10 s).
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fedrift
from conftest import tiny_config
from fedrift.cli import main

# every section key a user can set (options of the named entries included), with the
# config's own tiny values as the valid base
KEYS = {
    "seed": None,
    "data.name": None, "data.root": None, "data.augment": None, "data.crop_padding": None, "data.flip": None,
    "partition.name": None, "partition.alpha": None, "partition.num_clients": None, "partition.min_size": None,
    "partition.holdout": None, "partition.val_share": None,
    "model.name": None, "model.hidden": None,
    "algorithm.name": None,
    "train.rounds": None, "train.clients_per_round": None, "train.participation": None, "train.local_epochs": None,
    "train.local_steps": None, "train.batch_size": None, "train.lr": None, "train.momentum": None,
    "train.weight_decay": None, "train.clip_grad_norm": None,
    "engine.executor": None, "engine.device": None, "engine.sampling": None, "engine.sampling_retries": None,
    "engine.teacher_cache": None, "engine.max_parallel_clients": None, "engine.threads": None,
    "engine.client_state": None, "engine.workers": None, "engine.dropout": None, "engine.stragglers": None,
    "engine.straggler_work": None, "engine.accept_failures": None, "engine.checkpoint_every": None,
    "eval.every": None, "eval.batch_size": None, "eval.at_rounds": None, "eval.drift": None,
    "eval.probe_size": None, "eval.personalize": None, "eval.personalize_epochs": None,
    "eval.personalize_loss": None, "eval.personalize_mu": None,
    "privacy.level": None, "privacy.clip": None, "privacy.noise_multiplier": None, "privacy.delta": None,
    "output.overwrite": None, "output.progress": None, "output.save_model": None, "output.tensorboard": None,
}
SECTIONS = ("data", "partition", "model", "algorithm", "train", "engine", "eval", "privacy", "output")
# a dotted config key (or the config file) named in a refusal
NAMES_A_KEY = re.compile(r"\b((data|partition|model|algorithm|train|engine|eval|privacy|output): |seed|plugins|algorithms|seeds|sweep\.[\w.]+|--resume|--out|config file|"
                         r"(data|partition|model|algorithm|train|engine|eval|privacy|output)\.\w+)")

# values that are wrong for most keys, and some that are right for many (so accepted cases
# happen too); integers stay small where a valid huge value would cost memory before the loop
VALUES = st.one_of(
    st.text(max_size=6),
    st.integers(-3, 40),
    st.sampled_from([10**6, 10**12, -(10**9)]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.none(),
    st.booleans(),
    st.lists(st.integers(-2, 30), max_size=3),
    st.dictionaries(st.sampled_from(["a", "name", "x"]), st.integers(0, 3), max_size=2),
    st.sampled_from(["fedavg", "scaffold", "fedprox", "cnn", "mlp", "iid", "shards", "digits", "batched",
                     "processes", "uniform", "class_coverage", "client", "sample", "disk", "cuda"]),
)
UNKNOWN = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True)
# combinations that are each valid alone and impossible together
COMBOS = [
    {"train.clients_per_round": 7},  # more than the 6 clients
    {"train.clients_per_round": 2, "train.participation": 0.5},
    {"partition.name": "shards", "partition.classes_per_client": 11},
    {"algorithm.name": "scaffold", "privacy.level": "client"},
    {"algorithm.name": "fedcsd", "privacy.level": "sample"},
    {"privacy.level": "client", "privacy.clip": None},
    {"privacy.level": "client", "engine.sampling": "class_coverage"},
    {"data.name": "mnist1d", "model.name": "cnn"},  # a convolution on 40-long vectors
    {"algorithm.name": "feddf"},  # no held-out data
    {"algorithm.name": "fedproto", "eval.drift": True},
    {"partition.name": "natural"},  # digits have no natural groups
    {"data.root": "/"},  # an embedded dataset reads no root
    {"engine.device": "cuda"},  # no GPU here
    {"partition.num_clients": 2000},  # more clients than samples
]


class Accepted(Exception):
    """The stub round loop's signal: the config got through every check before training."""


@pytest.fixture
def stub_loop(monkeypatch):
    def stop(*args, **kwargs):
        raise Accepted

    monkeypatch.setattr("fedrift.api.run_federation", stop)
    monkeypatch.setattr("fedrift.experiments.compare.run_grid", lambda *a, **k: (_ for _ in ()).throw(Accepted()))


def _set(doc: dict, key: str, value) -> None:
    node = doc
    *head, last = key.split(".")
    for part in head:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _override(key: str, value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return f"{key}={text.removesuffix('...').strip()}"


def _check(capsys, argv: list[str], written: list[Path]) -> tuple[str, str]:
    """Run the CLI; ('refused', its message) or ('accepted', '') after checking what each must
    satisfy."""
    try:
        code = main(argv)
    except Accepted:
        return "accepted", ""
    except SystemExit as err:  # argparse's own refusals (exit 2, usage on stderr)
        code = err.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out, err
    assert code == 2, f"exit {code} for {argv}: {err}"
    lines = err.strip().splitlines()
    if lines and lines[0].startswith("usage:"):  # argparse
        assert lines[-1].startswith("fedrift") and "error:" in lines[-1], err
    else:
        assert len(lines) == 1 and lines[0].startswith("fedrift: error: "), f"{argv}: {err!r}"
        assert NAMES_A_KEY.search(lines[0]), f"names no key: {lines[0]}"
    for p in written:
        assert not p.exists(), f"refused ({lines[-1]}) but {p} was written"
    return "refused", lines[-1]


_count = itertools.count()


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    mutation=st.one_of(
        st.tuples(st.just("value"), st.sampled_from(sorted(KEYS)), VALUES),
        st.tuples(st.just("unknown"), st.sampled_from(SECTIONS), UNKNOWN),
        st.tuples(st.just("combo"), st.sampled_from(range(len(COMBOS))), st.none()),
        st.tuples(st.just("section"), st.sampled_from(SECTIONS), VALUES.filter(lambda v: not isinstance(v, dict))),
    ),
    as_file=st.booleans(),
)
def test_run_refuses_bad_configs_in_one_line_and_writes_nothing(tmp_path, capsys, stub_loop, mutation, as_file):
    kind, what, value = mutation
    run_dir = tmp_path / f"run{next(_count)}"
    doc = tiny_config(tmp_path, train={"rounds": 1})
    doc["output"]["dir"] = str(run_dir)
    changes = {what: value} if kind == "value" else COMBOS[what] if kind == "combo" else (
        {f"{what}.{value}": 1} if kind == "unknown" else {what: value})
    if kind == "unknown" and value in {k.split(".")[1] for k in KEYS if k.startswith(what + ".")} | {"name", "mu", "alpha"}:
        return  # generated a real key: not an unknown one
    argv = ["run"]
    if as_file or kind == "section":
        for k, v in changes.items():
            _set(doc, k, v)
        path = tmp_path / f"c{next(_count)}.yaml"
        path.write_text(yaml.safe_dump(doc))
        argv += ["-c", str(path)]
    else:
        path = tmp_path / f"c{next(_count)}.yaml"
        path.write_text(yaml.safe_dump(doc))
        argv += ["-c", str(path), *(_override(k, v) for k, v in changes.items())]
    outcome, message = _check(capsys, argv, [run_dir])
    event(f"{kind}: {outcome}")
    if kind == "unknown":
        assert outcome == "refused" and f"{what}.{value}: unknown key" in message, message
    if kind == "combo":
        assert outcome == "refused", f"accepted the impossible combination {changes}"
    shutil.rmtree(run_dir, ignore_errors=True)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    token=st.one_of(
        st.tuples(st.just("algorithms"), st.lists(st.sampled_from(["fedavg", "fedprox", "nope", "", "fedprox:mu=x",
                                                                     "fedprox:mu=-1", "fedavg", ":", "scaffold:"]),
                                                    max_size=3)),
        st.tuples(st.just("seeds"), st.lists(st.one_of(st.integers(-3, 3), st.sampled_from(["a", "1.5", "", "[1]"])),
                                             max_size=3)),
        st.tuples(st.sampled_from([f"sweep.{k}" for k in ("train.lr", "partition.alpha", "train.rounds", "seed",
                                                          "algorithm.name", "output.dir", "nope.key", "train.")]),
                  st.lists(VALUES.filter(lambda v: not isinstance(v, (dict, list))), max_size=3)),
        st.tuples(st.sampled_from(sorted(KEYS)), st.lists(VALUES, min_size=1, max_size=1)),
    ),
)
def test_compare_refuses_bad_grids_in_one_line_and_writes_nothing(tmp_path, capsys, stub_loop, token):
    key, values = token
    out = tmp_path / f"grid{next(_count)}"
    doc = tiny_config(tmp_path, train={"rounds": 1})
    doc.pop("output")
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(doc))
    if key in ("algorithms", "seeds") or key.startswith("sweep."):
        text = ",".join(yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
                        if not isinstance(v, str) else v for v in values)
        arg = f"{key}={text}"
    else:
        arg = _override(key, values[0])
    event(_check(capsys, ["compare", "-c", str(path), "--out", str(out), "--no-report", arg], [out])[0])


# ---------------------------------------------------------------------------------------
# corrupted run folders


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped after round 2 of 4 with a checkpoint of round 2, and its finished twin."""
    from fedrift.engine import outputs

    root = tmp_path_factory.mktemp("runs")
    cfg = tiny_config(root, train={"rounds": 4}, engine={"checkpoint_every": 2})
    cfg["output"]["dir"] = str(root / "stopped")
    log = outputs.RunWriter.log

    def stop(self, row):
        if row["round"] == 3:
            raise KeyboardInterrupt
        log(self, row)

    outputs.RunWriter.log = stop
    try:
        with pytest.raises(KeyboardInterrupt):
            fedrift.run(cfg)
    finally:
        outputs.RunWriter.log = log
    cfg["output"]["dir"] = str(root / "done")
    fedrift.run(cfg)
    return root


FILES = ["config.yaml", "metrics.jsonl", "summary.json", "partition.json", "checkpoint/manifest.json",
         "checkpoint/state-r000002.pt", "final_model.pt"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    which=st.sampled_from(["stopped", "done"]),
    name=st.sampled_from(FILES),
    damage=st.one_of(st.just("delete"), st.just("empty"), st.tuples(st.just("truncate"), st.floats(0.05, 0.95)),
                     st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=40)),
                     st.tuples(st.just("flip"), st.integers(0, 10**6))),
)
def test_corrupt_run_folders_get_clear_errors_from_report_and_resume(tmp_path, capsys, stopped_run, which, name, damage):
    runs = tmp_path / f"runs{next(_count)}"
    run = runs / which
    shutil.copytree(stopped_run / which, run)
    target = run / name
    if not target.exists():
        return  # the finished run has no checkpoint, the stopped one no final model
    data = target.read_bytes()
    kind = damage if isinstance(damage, str) else damage[0]
    if kind == "delete":
        target.unlink()
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "truncate":
        target.write_bytes(data[: int(len(data) * damage[1])])
    elif kind == "garbage":
        target.write_bytes(damage[1])
    elif data:
        i = damage[1] % len(data)
        target.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}

    code = main(["report", str(runs), "report.plots=false"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code in (0, 2), err
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("fedrift: error: "), err
    for p in runs.iterdir():  # what the report wrote
        if p.is_file():
            p.unlink()

    code = main(["run", "--resume", str(run), "output.progress=false"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 0:  # it could go on: only from damage to what a resume does not read
        if which == "done":  # its summary gone: a folder of a run killed before any checkpoint
            assert name == "summary.json" or kind == "delete" and name == "final_model.pt", (name, damage)
        else:
            # config.yaml: only damage that leaves the same config (its fingerprint is checked)
            assert name in ("summary.json", "partition.json", "config.yaml") or (
                kind == "delete" and name.startswith("checkpoint/")), (name, damage)
        return
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedrift: error: "), err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before, "a refused resume changed the folder"
