"""``fedrift report`` of run folders received from elsewhere (issue 68, F7-F9): a folder it
skips is named with why, a model file it cannot read leaves out its figure in one line, and
the plugins a run's config.yaml names are imported only with ``--trust-plugins``."""

from __future__ import annotations

import html
import shutil
import sys
import uuid

import pytest
import torch
import yaml
from conftest import tiny_config

from fedrift import plugins
from fedrift.algorithms import ALGORITHMS
from fedrift.api import run
from fedrift.cli import main

BAD_TAG = 'evil: !!python/object/apply:os.system ["echo owned"]\n'


class NotATensor:
    """Pickled into a model file: torch.load(weights_only=True) refuses it."""


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """One finished tiny run (digits, MLP, 2 rounds), copied by each test."""
    base = tmp_path_factory.mktemp("untrusted")
    return run(tiny_config(base, output={"dir": str(base / "run"), "progress": False})).output_dir


def runs(tmp_path, one_run, *names):
    root = tmp_path / "runs"
    for name in names:
        shutil.copytree(one_run, root / name)
    return root


def test_a_run_folder_with_a_refused_yaml_tag_is_named_with_why(tmp_path, one_run, capsys):
    root = runs(tmp_path, one_run, "good", "bad")
    config = root / "bad" / "config.yaml"
    config.write_text(BAD_TAG + config.read_text())
    assert main(["report", str(root), "report.plots=false"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if str(root / "bad") in line]
    assert len(said) == 1, out
    assert "config.yaml: not valid YAML" in said[0] and "python/object/apply:os.system" in said[0], said
    assert "skipped" in said[0]
    assert "1/1" in out  # the good run is reported
    assert "python/object/apply:os.system" in (root / "report.html").read_text()

    # with that run alone: the error names the folder and why, not "no folder with config.yaml"
    alone = runs(tmp_path / "alone", one_run, "bad")
    (alone / "bad" / "config.yaml").write_text(config.read_text())
    assert main(["report", str(alone)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(alone / "bad") in err and "not valid YAML" in err and "os.system" in err, err


def _refused(path):
    torch.save({"layer": NotATensor(), "w": torch.zeros(2)}, path)


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _not_a_state_dict(path):
    torch.save([torch.zeros(2)], path)


def _wrong_shapes(path):
    state = torch.load(path, weights_only=True)
    state = {k: torch.zeros(3, 3) for k in state}
    torch.save(state, path)


@pytest.mark.parametrize("damage, why", [
    (_refused, f"holds a Python object ({__name__}.NotATensor)"),
    (_truncated, "not a whole torch file"),
    (_not_a_state_dict, "not a state dict of tensors (it holds a list)"),
    (_wrong_shapes, "does not fit the model of the run's config.yaml (size mismatch"),
])
def test_a_model_file_it_cannot_read_leaves_out_the_tsne_in_one_line(tmp_path, one_run, capsys, damage, why):
    root = runs(tmp_path, one_run, "a")
    model = root / "a" / "final_model.pt"
    damage(model)
    assert main(["report", str(root), "report.tsne_points=20"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "t-SNE" in line]
    assert said == [f"t-SNE skipped: {model}: {said[0].partition(f'{model}: ')[2]}"], out
    assert why in said[0], said
    assert "weights_only" not in out and "Traceback" not in out
    page = (root / "report.html").read_text()
    assert html.escape(why) in page and "Learning curves" in page  # the rest of the report is made
    assert not (root / "figures" / "tsne.png").exists() and (root / "figures" / "learning_curves.png").is_file()


PLUGIN = '''
import pathlib

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams
from fedrift.algorithms.fedavg import ce_loss

pathlib.Path(__file__).with_name("IMPORTED").write_text("this plugin's code ran")


@ALGORITHMS.register("{name}", "a run folder's plugin algorithm", AlgorithmParams)
def build(hp, setup):
    return Algorithm(name="{name}", hparams=hp, local_loss=ce_loss)
'''


def test_a_run_folders_plugin_is_imported_only_with_trust_plugins(tmp_path, one_run, capsys, monkeypatch):
    module = f"tp_report_{uuid.uuid4().hex[:8]}"
    root = runs(tmp_path, one_run, "a")
    folder = root / "a"
    (folder / f"{module}.py").write_text(PLUGIN.format(name=module))
    doc = yaml.safe_load((folder / "config.yaml").read_text())
    doc["plugins"] = [module]
    doc["algorithm"] = {"name": module}
    (folder / "config.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.syspath_prepend(str(folder))  # as PYTHONPATH=. in the run folder
    monkeypatch.setattr(ALGORITHMS, "_entries", dict(ALGORITHMS._entries))
    monkeypatch.setattr(plugins, "_entry_points_done", True)
    marker = folder / "IMPORTED"
    try:
        assert main(["report", str(root), "report.plots=false"]) == 0
        out = capsys.readouterr().out
        assert not marker.exists() and module not in sys.modules
        notes = [line for line in out.splitlines() if line.startswith("plugins not imported")]
        assert len(notes) == 1 and module in notes[0] and "--trust-plugins" in notes[0], out
        assert f"{module}  " in out or f"{module} " in out  # reported under the name in its files

        assert main(["report", "--trust-plugins", str(root), "report.plots=false"]) == 0
        assert marker.is_file() and module in ALGORITHMS
        assert "plugins not imported" not in capsys.readouterr().out
    finally:
        sys.modules.pop(module, None)
