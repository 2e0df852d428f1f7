"""The examples page is generated from the files in examples/ (docs/_ext/fedrift_examples.py):
every config and every paper study is on it, and a new file appears by itself."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fedrift_examples", ROOT / "docs" / "_ext" / "fedrift_examples.py")
ex = importlib.util.module_from_spec(_spec)
sys.modules["fedrift_examples"] = ex
_spec.loader.exec_module(ex)


def _files() -> list[str]:
    return sorted({p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.yaml")}
                  | {p.relative_to(ROOT).as_posix() for p in (ROOT / "examples" / "papers").rglob("*.yaml")})


def test_every_example_and_paper_study_is_on_the_page():
    page = ex.examples_page()
    files = _files()
    assert any(f.endswith(".study.yaml") for f in files)  # the paper studies are among them
    for file in files:
        assert f"## `{file}`" in page, f"{file} has no section on the examples page"
        assert f"| [`{file}`](#" in page, f"{file} is not in the examples table"


def test_a_row_says_what_runs_what_it_reproduces_and_its_cost():
    files = ex.example_files()
    studies = {p: ex._load(p) for p in files if p.name.endswith(".study.yaml")}
    demo = ex.entry(ROOT / "examples" / "demo.yaml", "", studies)
    assert (demo["dataset"], demo["model"], demo["algorithms"]) == ("`mnist5k`", "`cnn`", "`fedprox`")
    assert demo["partition"].startswith("`dirichlet` (alpha 0.1")
    assert demo["cost"] == "30 x 5 x 1 = 150 client-epochs"
    assert "27 s" in demo["time"] and "header" in demo["time"]
    study = ex.entry(ROOT / "examples" / "papers" / "fedgkd-table3-cifar10.study.yaml", "", studies)
    assert study["kind"] == "study" and study["paper"].startswith("FedGKD (Yao et al.), Table 3, CIFAR-10")
    assert study["cost"].startswith("72 runs (8 entries x 3 seeds x 3 settings) of 100 x 4 x 20")
    base = ex.entry(ROOT / "examples" / "papers" / "fedgkd-table3-cifar10.yaml", "", studies)
    assert base["paper"] == study["paper"]  # the study's base config reproduces the same table


def test_a_new_example_appears_by_itself(tmp_path):
    folder = tmp_path / "examples"
    (folder / "papers").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "demo.yaml", folder / "demo.yaml")
    (folder / "new.yaml").write_text("# A new example: FedAvg on the digits.\n# About 5 s on 2 CPU cores.\n"
                                     "data: {name: digits}\nmodel: {name: mlp}\n"
                                     "train: {rounds: 3, clients_per_round: 2, local_epochs: 1}\n")
    root, ex.ROOT = ex.ROOT, tmp_path
    try:
        page = ex.examples_page(folder, tmp_path / "BENCHMARKS.md")
    finally:
        ex.ROOT = root
    assert "## `examples/new.yaml`" in page and "A new example: FedAvg on the digits." in page
    assert "3 x 2 x 1 = 6 client-epochs" in page and "About 5 s on 2 CPU cores (the file's header)" in page
