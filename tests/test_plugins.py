"""Plugins: the config's ``plugins`` list and the ``fedrift.plugins`` entry-point group, from
Python and through the CLI; the example plugin package in examples/ under every in-process
executor and in ``fedrift compare --jobs 2``."""

import json
import math
import os
import subprocess
import sys
import uuid
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import torch
import yaml

from conftest import forget_example_plugin, one_line_refusal
from fedrift import plugins
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import Setup
from fedrift.cli import main
from fedrift.config import load_config, plugin_list
from fedrift.data import DATASETS
from fedrift.data.partition import PARTITIONS
from fedrift.errors import ConfigError
from fedrift.models import MODELS

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "fedrift-example-plugin"
EXAMPLE_SRC = EXAMPLE / "src"
FAST = ["data.name=digits", "model.name=logreg", "partition.num_clients=4", "partition.min_size=2",
        "train.rounds=1", "train.clients_per_round=2", "train.local_epochs=1", "output.progress=false"]
# the example plugin's own pieces, small: 6 clients of blobs, 3 rounds
EXAMPLE_RUN = ["algorithm.name=fedla", "algorithm.tau=0.5", "data.name=blobs", "model.name=tinynet",
               "partition.num_clients=6", "train.rounds=3", "train.clients_per_round=3", "train.local_epochs=1",
               "output.progress=false"]

ALGORITHM_MODULE = '''
from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams
from fedrift.algorithms.fedavg import ce_loss

@ALGORITHMS.register("{name}", "a test plugin's algorithm", AlgorithmParams)
def build(hp, setup):
    return Algorithm(name="{name}", hparams=hp, local_loss=ce_loss)
'''


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder on sys.path for throwaway plugin modules; whatever they register and import
    is gone after the test, and entry points are looked up afresh."""
    for registry in (ALGORITHMS, MODELS, DATASETS, PARTITIONS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.setattr(plugins, "_entry_points_loaded", set())
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    before = set(sys.modules)
    (tmp_path / "lib").mkdir()
    yield tmp_path / "lib"
    for name in set(sys.modules) - before:  # and the installed example, if its entry point loaded here
        if name.startswith(("tp_", "fedrift_example_plugin")):
            del sys.modules[name]


def _unique(prefix: str) -> str:
    return f"tp_{prefix}_{uuid.uuid4().hex[:8]}"


def test_plugins_key_imports_before_validation_and_list_names_the_source(scratch, capsys, tmp_path):
    mod, alg = _unique("mod"), _unique("alg")
    (scratch / f"{mod}.py").write_text(ALGORITHM_MODULE.format(name=alg))
    # without the plugin the name is unknown; with it, the run goes
    one_line_refusal(capsys, ["run", *FAST, f"algorithm.name={alg}", f"output.dir={tmp_path / 'r'}"],
                    f"algorithm.name: unknown algorithm '{alg}'")
    assert main(["run", *FAST, f"plugins=[{mod}]", f"algorithm.name={alg}", f"output.dir={tmp_path / 'r'}"]) == 0
    assert ALGORITHMS.get(alg).source == f"plugin {mod}"
    assert ALGORITHMS.get("fedavg").source == "built in"
    resolved = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert resolved["plugins"] == [mod]  # a rerun, a worker or a resume imports it again
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith(alg))
    assert f"[plugin {mod}]" in line
    fedavg = next(x for x in out.splitlines() if x.strip().startswith("fedavg "))
    assert "[" not in fedavg  # built in: no marker


def test_an_entry_registered_from_a_script_names_its_module(monkeypatch):
    monkeypatch.setattr(ALGORITHMS, "_entries", dict(ALGORITHMS._entries))
    ALGORITHMS.register("tp_script_alg", "registered here")(lambda hp, setup: None)
    assert ALGORITHMS.get("tp_script_alg").source == f"module {__name__}"


def test_plugin_list_forms():
    assert plugin_list("a.b, c") == ["a.b", "c"]
    assert plugin_list(["a"]) == ["a"] and plugin_list(None) == []
    with pytest.raises(ConfigError, match="plugins: 3 is not a list of module names"):
        plugin_list(3)
    with pytest.raises(ConfigError, match="plugins"):
        load_config({"plugins": [""]})


def test_a_broken_plugin_is_one_line_and_leaves_nothing_registered(scratch, capsys, tmp_path):
    mod, alg = _unique("broken"), _unique("half")
    (scratch / f"{mod}.py").write_text(ALGORITHM_MODULE.format(name=alg) + "\nraise RuntimeError('boom at import')\n")
    run = tmp_path / "r"
    one_line_refusal(capsys, ["run", *FAST, f"plugins=[{mod}]", f"output.dir={run}"],
                    f"plugins: cannot import '{mod}': RuntimeError: boom at import")
    assert alg not in ALGORITHMS  # what it registered before failing is removed
    assert not run.exists()  # refused before anything was written
    # imported again (Python forgot the failed module): the same line, not "registered twice"
    one_line_refusal(capsys, ["compare", *FAST, f"plugins={mod}", "--out", str(tmp_path / "c")], "boom at import")
    one_line_refusal(capsys, ["list", "plugins=[no_such_module_xyz]"],
                    "plugins: cannot import 'no_such_module_xyz': ModuleNotFoundError",
                    "a plugin must be importable: an installed package (pip install DIR of its project), "
                    "or a module in a folder on PYTHONPATH")
    one_line_refusal(capsys, ["partition", "plugins=[no_such_module_xyz]", "--out", str(tmp_path / "p")], "no_such_module_xyz")


def test_a_plugin_python_cannot_find_is_told_how_to_make_it_importable(capsys, tmp_path, monkeypatch):
    """A module file in the current folder, which the console script does not import from:
    the line names PYTHONPATH=.; a module the plugin itself imports is to be installed."""
    mod, dep = _unique("here"), _unique("dep")
    (tmp_path / f"{mod}.py").write_text(f"import {dep}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    one_line_refusal(capsys, ["list", f"plugins=[{mod}]"], f"plugins: cannot import '{mod}': ModuleNotFoundError",
                    f"a plugin must be importable", f"(./{mod}.py is here: run with PYTHONPATH=.)")
    monkeypatch.syspath_prepend(str(tmp_path))
    one_line_refusal(capsys, ["list", f"plugins=[{mod}]"],
                    f"plugins: cannot import '{mod}': ModuleNotFoundError: No module named '{dep}', which {mod} "
                    "imports; install that package")


def _fake_distribution(lib: Path, dist: str, entries: dict[str, str]) -> None:
    """A package as pip installs one, as far as importlib.metadata looks: a .dist-info
    folder with METADATA and entry_points.txt on sys.path."""
    info = lib / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[fedrift.plugins]\n{lines}")


def test_entry_point_plugins_are_found_without_naming_them(scratch, capsys, tmp_path):
    mod, call_mod = _unique("ep"), _unique("epcall")
    alg, alg2 = _unique("epalg"), _unique("epalg2")
    (scratch / f"{mod}.py").write_text(ALGORITHM_MODULE.format(name=alg))
    # the callable form: the entry point names a function, called once
    (scratch / f"{call_mod}.py").write_text("def register():\n" + "".join(
        f"    {line}\n" for line in ALGORITHM_MODULE.format(name=alg2).strip().splitlines()))
    _fake_distribution(scratch, "tp-fake-plugin", {"fake": mod, "fake_call": f"{call_mod}:register"})
    assert main(["run", *FAST, f"algorithm.name={alg}", f"output.dir={tmp_path / 'r'}"]) == 0
    assert ALGORITHMS.get(alg).source == "entry point fake of tp-fake-plugin"
    assert ALGORITHMS.get(alg2).source == "entry point fake_call of tp-fake-plugin"
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"[entry point fake of tp-fake-plugin]" in next(x for x in out.splitlines() if alg in x)
    plugins._entry_points_done = False  # looked up again (monkeypatch restores it): nothing registered twice
    plugins.load_entry_points()
    assert len([n for n in ALGORITHMS.names() if n in (alg, alg2)]) == 2


def test_a_broken_entry_point_names_it_and_its_package(scratch, capsys, tmp_path):
    mod = _unique("epbroken")
    (scratch / f"{mod}.py").write_text("import no_such_dependency_xyz\n")
    _fake_distribution(scratch, "tp-broken-plugin", {"broken": mod})
    one_line_refusal(capsys, ["run", *FAST, f"output.dir={tmp_path / 'r'}"],
                    "fedrift.plugins entry point 'broken' of tp-broken-plugin", f"({mod})",
                    "ModuleNotFoundError: No module named 'no_such_dependency_xyz'", "uninstall")
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------
# The example plugin package (examples/fedrift-example-plugin)


@pytest.fixture(scope="module")
def example():
    """The example plugin imported from its source folder (installed nowhere); it stays
    registered for the session, as an installed plugin would be."""
    forget_example_plugin()  # imported (and unregistered since) by another test: imported afresh
    sys.path.insert(0, str(EXAMPLE_SRC))
    try:
        import fedrift_example_plugin  # noqa: F401
        from fedrift_example_plugin import algorithm
    finally:
        sys.path.remove(str(EXAMPLE_SRC))
    return algorithm


SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0,
              clip_grad_norm=None, seed=0)


def _loss(alg, logits, y, counts):
    batch = {"x": torch.zeros(len(y), 1), "y": torch.tensor(y), "w": torch.full((len(y),), 1.0 / len(y))}
    loss, _ = alg.local_loss({}, batch, {}, {"label_counts": torch.tensor(counts)}, lambda p, x: logits)
    return float(loss)


def test_fedla_loss_by_hand(example):
    """Counts (3, 1, 0), smoothing 1: prior (4, 2, 1) / 7. With zero logits the adjusted
    softmax is the prior itself (tau 1) or prior^2 / sum prior^2 (tau 2)."""
    zeros = torch.zeros(2, 3)
    la = make("fedla", SETUP, tau=1.0)
    assert _loss(la, zeros, [0, 2], [3, 1, 0]) == pytest.approx(0.5 * (math.log(7 / 4) + math.log(7)), rel=1e-6)
    la2 = make("fedla", SETUP, tau=2.0)
    assert _loss(la2, zeros, [0, 0], [3, 1, 0]) == pytest.approx(math.log(21 / 16), rel=1e-6)
    # smoothing 3: prior (6, 4, 3) / 13
    la3 = make("fedla", SETUP, tau=1.0, smoothing=3.0)
    assert _loss(la3, zeros, [1, 1], [3, 1, 0]) == pytest.approx(math.log(13 / 4), rel=1e-6)
    # tau 0 is FedAvg's loss exactly, on any logits
    z = torch.tensor([[0.3, -1.2, 2.0], [1.0, 0.5, -0.7]])
    assert _loss(make("fedla", SETUP, tau=0.0), z, [2, 1], [5, 0, 1]) == _loss(make("fedavg", SETUP), z, [2, 1], [5, 0, 1])
    with pytest.raises(ConfigError, match="algorithm.smoothing"):
        make("fedla", SETUP, smoothing=0)


def test_fedla_is_refused_under_sample_level_privacy(example, tiny):
    from fedrift.api import build_run, prepare

    cfg = tiny(algorithm={"name": "fedla"}, privacy={"level": "sample"})
    with pytest.raises(ConfigError, match="privacy.level: sample: its logit adjustment of fedla reads the client's label counts"):
        build_run(prepare(cfg))


def test_example_model_and_dataset(example):
    from fedrift.data import load_dataset
    from fedrift.models import build_model

    ds = load_dataset("blobs", None, DATASETS.get("blobs").params(num_samples=100, num_classes=3, dim=5))
    assert ds.x_train.dtype == torch.float32 and ds.input_shape == (5,) and ds.num_classes == 3
    assert len(ds.y_train) == 80 and len(ds.y_test) == 20
    model = build_model("tinynet", MODELS.get("tinynet").params(hidden=7, projection_dim=4), (5,), 3, seed=0)
    h, logits = model(ds.x_test[:6], mode="both")
    assert h.shape == (6, 4) and logits.shape == (6, 3) and model.feature_dim == 4
    assert torch.equal(model.head(model.features(ds.x_test[:6])), logits)
    assert any(k.startswith("proj.") for k in model.state_dict())


def _env(*extra: Path) -> dict[str, str]:
    """This checkout's fedrift first (the subprocesses run elsewhere: paths made absolute)."""
    inherited = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(REPO / "src"), *map(str, extra), *inherited])
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "fedrift.cli", *args], capture_output=True, text=True,
                          env=_env(EXAMPLE_SRC), cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _final(run: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["test_accuracy"] for r in rows], torch.load(run / "final_model.pt", weights_only=True)


@pytest.mark.process
def test_example_plugin_on_the_command_line_under_every_executor(example, tmp_path):
    """sequential and batched in this process, processes in a fresh ``fedrift run`` (its
    workers import the plugin from the run's config): processes equals one-thread sequential
    bit for bit, batched to float rounding."""
    args = [*EXAMPLE_RUN, "plugins=[fedrift_example_plugin]"]
    for executor in ("sequential", "batched"):
        assert main(["run", *args, f"engine.executor={executor}", f"output.dir={tmp_path / executor}"]) == 0
    _cli(["run", *args, "engine.executor=processes", "engine.workers=2", f"output.dir={tmp_path / 'processes'}"], tmp_path)
    acc, model = _final(tmp_path / "sequential")
    acc_p, model_p = _final(tmp_path / "processes")
    acc_b, model_b = _final(tmp_path / "batched")
    assert acc == acc_p and all(torch.equal(model[k], model_p[k]) for k in model)
    assert all(torch.allclose(model[k], model_b[k], atol=1e-5) for k in model)
    assert acc[-1] > 0.5  # 4 blobs: far above chance
    assert json.loads((tmp_path / "processes" / "summary.json").read_text())["executor"] == "processes"


@pytest.mark.process
def test_example_plugin_beside_fedavg_in_compare_with_two_jobs(example, tmp_path):
    out = tmp_path / "grid"
    proc = _cli(["compare", "plugins=[fedrift_example_plugin]", *[a for a in EXAMPLE_RUN if not a.startswith("algorithm.")],
                 "algorithms=fedavg,fedla:tau=0.5", "seeds=0,1", "--jobs", "2", "--out", str(out), "--no-report"], tmp_path)
    assert "4 to run on 2 processes" in proc.stdout
    rows = (out / "results.csv").read_text()
    assert "fedavg" in rows and "fedla:tau=0.5" in rows
    # the same run in this process: the grid's worker gave the same result
    assert main(["run", *EXAMPLE_RUN, "plugins=[fedrift_example_plugin]", "engine.executor=sequential",
                 f"output.dir={tmp_path / 'alone'}"]) == 0
    assert _final(out / "fedla-tau=0.5" / "seed0")[0] == _final(tmp_path / "alone")[0]


@pytest.mark.process
def test_installed_example_plugin_through_its_entry_point(installed_example_plugin, tmp_path, capsys):
    """An installed plugin package (here the example, as ``pip install -e`` would put it: its
    dist-info and source on the path, not in the environment) is found through its
    fedrift.plugins entry point, with no plugins key: in this process and in a fresh one."""
    assert distribution("fedrift-example-plugin").entry_points.select(group="fedrift.plugins")
    assert main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("fedla "))
    assert "[entry point example of fedrift-example-plugin]" in line
    env = _env(*installed_example_plugin.split(os.pathsep))
    run = subprocess.run([sys.executable, "-m", "fedrift.cli", "run", *EXAMPLE_RUN, f"output.dir={tmp_path / 'r'}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "fedla on blobs" in run.stdout


def test_the_example_plugin_is_not_installed_by_setup():
    """``make setup`` installs fedrift, not the example: a user's ``fedrift list`` (and every
    allowed list, and select's field) holds fedrift's own entries and the user's plugins only."""
    from importlib.metadata import entry_points

    setup = (REPO / "Makefile").read_text().split("\n$(STAMP):")[1].split("\n\n")[0]
    assert "PLUGIN" not in setup and "fedrift-example-plugin" not in setup, setup
    # an environment set up before this rule may still hold it: the message says how to remove it
    with pytest.raises(PackageNotFoundError):
        distribution("fedrift-example-plugin")
        pytest.fail("fedrift-example-plugin is installed here: pip uninstall -y fedrift-example-plugin")
    assert not [ep for ep in entry_points(group=plugins.GROUP) if ep.value.startswith("fedrift_example_plugin")], \
        "fedrift-example-plugin's entry points are installed here: pip uninstall -y fedrift-example-plugin"
