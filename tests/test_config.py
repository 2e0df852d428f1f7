from pathlib import Path

import pytest

from fedrift.config import Config, apply_overrides, load_config
from fedrift.errors import ConfigError


def test_defaults_match_the_contract():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert (cfg.data.name, cfg.partition.name, cfg.model.name, cfg.algorithm.name) == ("mnist5k", "dirichlet", "cnn", "fedavg")
    assert (cfg.train.lr, cfg.train.momentum, cfg.train.weight_decay) == (0.05, 0.9, 1e-5)


def test_overrides_are_dotted_and_parsed_as_yaml():
    doc = apply_overrides({"train": {"rounds": 5}}, ["train.rounds=10", "algorithm.name=fedprox", "algorithm.mu=0.1",
                                                     "model.hidden=[8, 4]", "output.progress=false", "data.root=null"])
    assert doc == {"train": {"rounds": 10}, "algorithm": {"name": "fedprox", "mu": 0.1}, "model": {"hidden": [8, 4]},
                   "output": {"progress": False}, "data": {"root": None}}
    assert load_config({}, ["train.lr=0.5"]).train.lr == 0.5


def _refused(overrides, doc=None):
    with pytest.raises(ConfigError) as err:
        load_config(doc or {}, overrides)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_unknown_key_names_the_key_and_the_allowed_ones():
    msg = _refused(["train.epochs=3"])
    assert msg.startswith("train.epochs: unknown key; allowed:") and "local_epochs" in msg
    assert _refused(["colour=red"]).startswith("colour: unknown key; allowed: algorithm, data")


@pytest.mark.parametrize("override, allowed", [
    ("algorithm.nmae=fedprox", "algorithm.nmae: unknown key; allowed: name, aggregation"),
    ("algorithm.mux=1", "algorithm.mux: unknown key; allowed: name, aggregation, mu"),
    ("data.nmae=cifar10", "data.nmae: unknown key; allowed: name, accept_changed, augment, crop_padding, flip, root, split_seed, "
                          "test_fraction"),
    ("partition.nmae=iid", "partition.nmae: unknown key; allowed: name, holdout, val_share, alpha, "),
    ("model.foo=1", "model.foo: unknown key; allowed: name (this model takes no options of its own)"),
])
def test_an_unknown_key_of_a_named_section_lists_the_sections_own_keys_too(override, allowed):
    """A misspelt ``name`` is an unknown option of the section's entry: the allowed keys are
    the section's own (name first) and then the entry's options."""
    from fedrift.api import prepare

    over = [override] if not override.startswith(("algorithm.mux", "model.foo")) else (
        ["algorithm.name=fedprox", override] if override.startswith("algorithm") else ["model.name=logreg", override])
    with pytest.raises(ConfigError) as err:
        prepare({"data": {"name": "digits"}}, over)
    assert str(err.value).startswith(allowed), str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [("train.lr=-1", "train.lr"), ("train.participation=1.5", "train.participation"),
     ("train.participation=0", "train.participation"), ("train.rounds=0", "train.rounds"),
     ("train.rounds=many", "train.rounds"), ("engine.device=tpu", "engine.device"),
     ("train.momentum=1", "train.momentum")],
)
def test_bad_values_name_the_key(override, key):
    assert _refused([override]).startswith(key + ":")


def test_cohort_size_is_a_count_or_a_fraction_not_both():
    assert "clients_per_round" in _refused(["train.clients_per_round=3", "train.participation=0.5"])


def test_missing_data_folder_is_refused(tmp_path):
    said = _refused([f"data.root={tmp_path / 'nope'}"])
    assert said.startswith(f"data.root: '{tmp_path / 'nope'}' does not exist; expected a folder")


def test_bad_override_syntax_and_missing_file(tmp_path):
    assert "key=value" in _refused(["train.rounds"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


FILE = {"partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 7, "holdout": 0.1},
        "algorithm": {"name": "fedprox", "mu": 0.01, "aggregation": "uniform"}}


def test_a_new_name_drops_the_old_entrys_options_and_keeps_the_shared_ones():
    from fedrift.api import shared_options

    cfg = load_config(FILE, ["algorithm.name=fedavg", "partition.name=iid"], shared_options)
    assert cfg.algorithm.options_dict == {"aggregation": "uniform"}  # mu was fedprox's
    assert cfg.partition.options_dict == {"num_clients": 7} and cfg.partition.holdout == 0.1
    # moon has a mu too, but another one: fedprox's does not follow
    assert load_config(FILE, ["algorithm.name=moon"], shared_options).algorithm.options_dict == {"aggregation": "uniform"}
    # natural's num_clients is its own (the group count), not the dirichlet one
    assert load_config(FILE, ["partition.name=natural"], shared_options).partition.options_dict == {}


def test_options_given_on_the_command_line_are_kept_whatever_their_order():
    from fedrift.api import shared_options

    for order in (["algorithm.mu=0.5", "algorithm.name=moon"], ["algorithm.name=moon", "algorithm.mu=0.5"]):
        assert load_config(FILE, order, shared_options).algorithm.options_dict["mu"] == 0.5
    same = load_config(FILE, ["algorithm.name=fedprox"], shared_options)  # same name: nothing dropped
    assert same.algorithm.options_dict == {"mu": 0.01, "aggregation": "uniform"}


def test_the_issues_commands_run(tmp_path):
    import fedrift

    for over in (["algorithm.name=fedavg", "partition.alpha=0.5"], ["partition.name=iid"]):
        out = tmp_path / "_".join(over)
        r = fedrift.run(Path(__file__).parents[1] / "examples" / "demo.yaml", [*over, "model.name=logreg", "train.rounds=1", f"output.dir={out}",
                                                "output.progress=false", "engine.executor=sequential"])
        assert r.summary["status"] == "completed"


@pytest.mark.parametrize(
    "overrides, start",
    [(["train.lr_schedule=linear"], "train.lr_schedule: input should be 'constant', 'step' or 'cosine'"),
     (["train.lr_schedule=step"], "train.lr_milestones: lr_schedule step needs at least one round"),
     (["train.lr_schedule=step", "train.lr_milestones=[30,20]"], "train.lr_milestones: [30, 20] must increase strictly"),
     (["train.lr_schedule=step", "train.lr_milestones=[20,20]"], "train.lr_milestones: [20, 20] must increase strictly"),
     (["train.lr_schedule=step", "train.lr_milestones=[10,51]"], "train.lr_milestones: round 51 is after the last round (50)"),
     (["train.lr_schedule=step", "train.lr_milestones=[0,10]"], "train.lr_milestones.0: input should be greater than or equal to 1"),
     (["train.lr_schedule=step", "train.lr_milestones=[10]", "train.lr_gamma=0"], "train.lr_gamma: input should be greater than 0"),
     (["train.lr_schedule=step", "train.lr_milestones=[10]", "train.lr_gamma=2"], "train.lr_gamma: input should be less than or equal to 1"),
     (["train.lr_milestones=[10]"], "train.lr_milestones: used by train.lr_schedule step only, and this run's is constant"),
     (["train.lr_schedule=cosine", "train.lr_gamma=0.5"], "train.lr_gamma: used by train.lr_schedule step only, and this run's is cosine"),
     (["train.lr_schedule=step", "train.lr_milestones=[10]", "train.lr_min=0.01"],
      "train.lr_min: used by train.lr_schedule cosine only, and this run's is step"),
     (["train.lr_schedule=cosine", "train.lr_min=-1"], "train.lr_min: input should be greater than or equal to 0"),
     (["train.lr_schedule=cosine", "train.lr=0.05", "train.lr_min=0.1"], "train.lr_min: 0.1 is above train.lr (0.05)")],
)
def test_lr_schedule_refusals_name_the_key(overrides, start):
    assert _refused(overrides).startswith(start)


def test_lr_schedule_keys_at_their_defaults_are_accepted_with_any_schedule():
    """A resolved config.yaml holds every key, the unused ones at their defaults: it loads again."""
    from fedrift.config import to_yaml
    import yaml

    for over in (["train.lr_schedule=cosine", "train.lr_min=0.001"], ["train.lr_schedule=step", "train.lr_milestones=[5]"], []):
        cfg = load_config({}, over)
        assert load_config(yaml.safe_load(to_yaml(cfg))) == cfg
    assert load_config({}, ["train.lr_schedule=step", "train.lr_milestones=[1,50]"]).train.lr_at(1) == pytest.approx(0.005)


def test_yaml_by_libyaml_reads_and_writes_what_pure_python_pyyaml_does(tmp_path):
    """fedrift.yamlio's C parser and emitter give PyYAML's pure-Python documents and texts (the
    examples, and each one's resolved config as a run writes it), and a text the C parser
    refuses gets PyYAML's usual error (a text's quotes the line, a file's names the file)."""
    import yaml

    from fedrift import yamlio
    from fedrift.api import prepare
    from fedrift.engine.build import resolved_yaml

    root = Path(__file__).resolve().parents[1] / "examples"
    files = sorted(root.rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        text = path.read_text()
        doc = yaml.safe_load(text)
        assert yamlio.load(text) == doc, path
        assert yamlio.dump(doc) == yaml.safe_dump(doc, sort_keys=False), path
    resolved = resolved_yaml(prepare(str(root / "demo.yaml")))
    assert yamlio.dump(yamlio.load(resolved)) == yaml.safe_dump(yaml.safe_load(resolved), sort_keys=False) == resolved
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {rounds: 3\nmodel: cnn\n")
    with pytest.raises(yaml.YAMLError) as python, bad.open() as f:
        yaml.safe_load(f)
    with pytest.raises(yaml.YAMLError) as ours, bad.open() as f:
        yamlio.load(f)
    assert str(ours.value) == str(python.value) and "bad.yaml" in str(ours.value)
    with pytest.raises(yaml.YAMLError) as python:
        yaml.safe_load(bad.read_text())
    with pytest.raises(yaml.YAMLError) as ours:
        yamlio.load(bad.read_text())
    assert str(ours.value) == str(python.value) and "^" in str(ours.value)
