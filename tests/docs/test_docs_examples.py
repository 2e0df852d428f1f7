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
    adc = ex.entry(ROOT / "examples" / "papers" / "fedadc-table1-cifar10.study.yaml", "", studies)
    # 10 entries (FedADC twice, Nesterov and heavy ball: 9 algorithm names) x 4 seeds x 2 values of C
    assert adc["cost"].startswith("80 runs (10 entries x 4 seeds x 2 settings) of 500 x 20 x 2, 500 x 10 x 2: "
                                  "1,200,000 client-epochs, and the tune")
    base = ex.entry(ROOT / "examples" / "papers" / "fedgkd-table3-cifar10.yaml", "", studies)
    assert base["paper"] == study["paper"]  # the study's base config reproduces the same table



def test_every_paper_study_header_gives_its_cost_at_full_scale_on_a_cpu_and_a_gpu():
    """Issue 72 item 3: a study's header says what it costs at full scale, on a CPU and on a GPU
    (a time or "not measured"), and how to see it on one's own machine first (--dry-run)."""
    for path in sorted((ROOT / "examples" / "papers").glob("*.study.yaml")):
        text = " ".join(ex.header(path))
        rel = path.relative_to(ROOT).as_posix()
        assert "Cost at full scale" in text and "training samples" in text, rel
        assert "CPU (2 cores" in text and "GPU" in text, rel
        assert f".venv/bin/fedrift study run {rel} --dry-run" in ex.commands(ex.header(path)), rel
        assert "a GPU;" not in text, rel  # no bare "a GPU" for a cost
        assert not ex.STATED.search(text), rel  # estimates, not a time measured for this file

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
