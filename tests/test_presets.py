"""examples/papers: every paper preset names its study file, and every study file validates.

Validation is ``load_study``'s (the study file's keys, entries, spaces, report and published
table) and ``build_grid``'s, the one ``fedrift study run`` (through ``fedrift compare``) runs
before anything: every run's config and registry options, the partition, and each setting's
model and algorithm. The presets read CIFAR from disk; here the data section is swapped for a
small ``npz`` of the same image shape and class count, everything else is the study's.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedrift.config import DataConfig, read_yaml
from fedrift.experiments.grid import build_grid
from fedrift.experiments.study_file import load_study
from fedrift.report.published import PUBLISHED, data_caveat, match

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted(p for p in (REPO / "examples" / "papers").glob("*.yaml") if not p.name.endswith(".study.yaml"))
STUDIES = sorted((REPO / "examples" / "papers").glob("*.study.yaml"))


def study_command(path: Path) -> str | None:
    """The study file a file's header comment gives ``fedrift study run`` for."""
    found = re.search(r"^#\s+\.venv/bin/fedrift study run (\S+)(\s+#.*)?$", path.read_text(), re.M)
    return found[1] if found else None


def stand_in(folder: Path, classes: int, per_class: int) -> Path:
    """An .npz of 3x32x32 uint8 images (CIFAR's shape), ``per_class`` of each class."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(classes), per_class)
    x = rng.integers(0, 256, size=(len(y), 32, 32, 3), dtype=np.uint8)
    folder.mkdir()
    np.savez(folder / "data.npz", x_train=x, y_train=y, x_test=x[::5], y_test=y[::5])
    return folder


def test_there_is_a_preset_per_seed_table_design_and_a_study_per_table():
    assert [p.name for p in PRESETS] == ["fedadc-table1-cifar10-c0.1.yaml", "fedadc-table1-cifar10-c0.2.yaml",
                                         "fedcsd-table1-cifar100.yaml", "fedgkd-table3-cifar10.yaml"]
    assert [p.name for p in STUDIES] == ["fedadc-table1-cifar10.study.yaml", "fedcsd-table1-cifar100.study.yaml",
                                         "fedgkd-table3-cifar10.study.yaml"]
    for preset in PRESETS:  # each design names the study that reproduces its table
        assert (REPO / study_command(preset)).is_file(), preset.name


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_a_study_file_validates_and_reproduces_its_table(path, tmp_path):
    assert study_command(path) == str(path.relative_to(REPO))  # its header's way to reproduce it
    study = load_study(path)
    table = PUBLISHED[study.report["paper"]]
    doc = study.base
    # the base is a setting of its paper's table, and so is every swept value
    assert match(table, doc) is not None
    for key, values in study.sweep.items():
        for value in values:
            section, option = key.split(".")
            assert match(table, {**doc, section: {**doc[section], option: value}}) is not None, (key, value)
    names = [e.name for e in study.entries]
    assert names[0] == "fedavg" and set(names) <= set(table.methods.values())
    assert study.report["claims"] == ["papers"]
    if doc["data"]["name"] == "imagefolder":  # the JPEG copy, said so beside CIFAR-10's numbers
        assert doc["data"]["root"] == "../shared/data/cifar10-jpeg"
        assert data_caveat(table, doc).startswith("CIFAR-10 (JPEG q75 copy) vs published CIFAR-10")
    else:
        assert doc["data"]["name"] == table.data_name and data_caveat(table, doc) is None
    classes = 100 if table.data_name == "cifar100" else 10
    data = stand_in(tmp_path / "data", classes, 2000 // classes)
    over = [*study.overrides, "data.name=npz", f"data.root={data}"]
    built = build_grid(study.config, algorithms=[e.entry for e in study.entries], seeds=[0], overrides=over,
                       out=tmp_path / "all")
    assert len(built.runs) == len(study.entries)
    swept = build_grid(study.config, algorithms=["fedavg"], seeds=[0], sweep=study.sweep, overrides=over,
                       out=tmp_path / "sweep")  # the swept values, on one algorithm
    assert len(swept.runs) == len(next(iter(study.sweep.values())))


def test_the_presets_use_the_papers_own_settings():
    gkd = read_yaml(REPO / "examples/papers/fedgkd-table3-cifar10.yaml")
    assert gkd["train"]["clip_grad_norm"] == 10  # the released code clips every method, FedAvg included
    assert (gkd["train"]["rounds"], gkd["train"]["local_epochs"], gkd["train"]["batch_size"]) == (100, 20, 64)
    entries = [e.entry for e in load_study(REPO / "examples/papers/fedgkd-table3-cifar10.study.yaml").entries]
    assert "fedgkd_plus:model.projection_dim=256" in entries
    for c, cohort in (("0.2", 20), ("0.1", 10)):
        adc = read_yaml(REPO / f"examples/papers/fedadc-table1-cifar10-c{c}.yaml")
        assert adc["algorithm"]["aggregation"] == "uniform" and adc["train"]["clients_per_round"] == cohort
        assert (adc["partition"]["num_clients"], adc["train"]["rounds"], adc["train"]["local_epochs"]) == (100, 500, 2)
        assert match(PUBLISHED["fedadc-table1-cifar10"], adc) == (0 if c == "0.2" else 1)
    # each preset says which training pipeline its paper's code used, and takes it: crop and flip
    # in FedGKD's and FedCSD's released code; FedADC names none
    for preset in PRESETS:
        assert "# Training pipeline" in preset.read_text(), preset.name
    csd = read_yaml(REPO / "examples/papers/fedcsd-table1-cifar100.yaml")
    assert gkd["data"]["augment"] is True and csd["data"]["augment"] is True and "augment" not in adc["data"]
    assert "crop_padding" not in gkd["data"] and DataConfig.model_fields["crop_padding"].default == 4  # RandomCrop(32, 4)


@pytest.mark.parametrize("name, paper, classes", [("workload_r1", "fedgkd-table3-cifar10", 10),
                                                  ("workload_r3", "fedgkd-table3-tinyimagenet", 200)])
def test_the_real_image_workloads_are_settings_of_their_tables_and_validate(name, paper, classes, tmp_path):
    """R1 and R3 (BENCHMARKS.md R): a setting of the paper's table (its alpha), and the runs
    their studies (benchmarks/studies/r1.yaml, r3.yaml) start build, the data swapped for a stand-in."""
    path = REPO / "examples" / f"{name}.yaml"
    doc = read_yaml(path)
    assert match(PUBLISHED[paper], doc) is not None
    data = stand_in(tmp_path / "data", classes, 4000 // classes)
    built = build_grid(path, algorithms=["fedavg", "fedgkd", "fedadc", "fedcsd", "fedprox:mu=0.01"], seeds=[0],
                       overrides=["data.name=npz", f"data.root={data}"], out=tmp_path / "all")
    assert len(built.runs) == 5


def test_r3_is_r1_on_tiny_imagenet_for_30_rounds():
    r1, r3 = (read_yaml(REPO / f"examples/workload_{w}.yaml") for w in ("r1", "r3"))
    assert r3["data"] == {"name": "tinyimagenet", "root": "data/tinyimagenet", "size": 32}
    assert r3["train"] == {**r1["train"], "rounds": 30}
    assert {k: v for k, v in r3.items() if k not in ("data", "train", "eval")} == \
        {k: v for k, v in r1.items() if k not in ("data", "train", "eval")}
