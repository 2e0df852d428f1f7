"""A run's pieces built from its config: dataset, partition, model, algorithm, training tools.

One module, below the API, that every place a run is built calls: ``fedrift.api`` (the
server's side), the ``processes`` executor's workers and the Ray actors (the client side),
and the Flower apps. Whatever builds a run here builds the same one from the same config.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, Setup
from fedrift.config import Config, load_config, to_yaml, validate_options
from fedrift.data import DATASETS, Dataset, load_dataset
from fedrift.data.notices import natural_groups_notice, say_once
from fedrift.data.partition import PARTITIONS, partition_dataset
from fedrift.data.partition_base import Partition
from fedrift.engine import privacy
from fedrift.engine.augment import Augment
from fedrift.engine.executor_choice import EXECUTORS
from fedrift.engine.local import make_apply, make_tools, prefers_channels_last
from fedrift.engine.outputs import auto_dir
from fedrift.engine.round_types import RoundTools
from fedrift.engine.sampling import SAMPLERS, cohort_size
from fedrift.engine.step_values import LR
from fedrift.engine.tensorboard import summary_writer_class
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model
from fedrift.models.base import FedModel
from fedrift.params import with_options
from fedrift.plugins import load_plugins


@dataclass
class Prepared:
    """Everything a run needs, built and validated before anything is written."""

    config: Config
    options: dict[str, Any]  # section -> validated options object
    dataset: Dataset
    partition: Partition
    device: torch.device


SECTION_REGISTRIES = {"data": DATASETS, "partition": PARTITIONS, "model": MODELS, "algorithm": ALGORITHMS}


def shared_options(section: str, old: str, new: str) -> set[str]:
    """Options that entries ``old`` and ``new`` of ``section`` both have from one options class
    (``num_clients`` of every partition but ``natural``, ``aggregation`` of every algorithm):
    an override of the section's name keeps them and drops the old entry's own."""
    registry = SECTION_REGISTRIES[section]
    if old not in registry or new not in registry:
        return set()
    a, b = registry.get(old).params, registry.get(new).params
    if a is None or b is None:
        return set()
    return {k for k in getattr(a, "__dataclass_fields__", {}) if _declared_by(a, k) in b.__mro__}


def _declared_by(cls: type, key: str) -> type | None:
    return next((c for c in cls.__mro__ if key in c.__dict__.get("__annotations__", {})), None)


def resolve_options(cfg: Config) -> dict[str, Any]:
    """Validate every named section's options against its registry entry."""
    out = {}
    for section, registry in SECTION_REGISTRIES.items():
        named = getattr(cfg, section)
        entry = registry.get(named.name, f"{section}.name")
        extra = named.options_dict
        out[section] = validate_options(section, entry.params, extra)
    EXECUTORS.get(cfg.engine.executor, "engine.executor")
    SAMPLERS.get(cfg.engine.sampling, "engine.sampling")
    return out


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine.device: cuda requested but torch sees no GPU here; allowed: auto, cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def set_cudnn_choice(cfg: Config) -> bool:
    """``engine.cudnn_benchmark`` put into torch's flag (the process's); returns the flag as it
    was. A process that trains one run's clients alone (a ``processes`` worker, a Ray actor, a
    Flower node) keeps it set."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = cfg.engine.cudnn_benchmark
    return before


@contextmanager
def cudnn_choice(cfg: Config) -> Iterator[None]:
    """``engine.cudnn_benchmark`` in effect for the block, torch's flag as it was afterwards.
    Stacked runs, each in a thread of its own, share one value (their engine sections are
    equal), and their caller holds it around them all, so that no run's end turns it back while
    another still trains."""
    before = set_cudnn_choice(cfg)
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def prepare(config: Config | Mapping[str, Any] | str | Path | None, overrides: list[str] | None = None,
            datasets: dict[Any, Dataset] | None = None) -> Prepared:
    """The config loaded and validated, its dataset loaded and partitioned: nothing written yet.
    ``datasets``: loaded datasets by their data section and device, shared by the runs that
    read the same one (stacked runs: one copy of the training set, on the device, for all)."""
    cfg = load_config(config, overrides, shared_options)
    options = resolve_options(cfg)
    device = resolve_device(cfg.engine.device)
    root = Path(cfg.data.root).expanduser() if cfg.data.root else None
    key = (cfg.data.name, str(root), repr(options["data"]), str(device))
    dataset = datasets.get(key) if datasets is not None else None
    if dataset is None:
        dataset = load_dataset(cfg.data.name, root, options["data"])
        if datasets is not None:  # the inputs on the device once: every run's Federation holds the same
            dataset = dataclasses.replace(dataset, x_train=dataset.x_train.to(device), x_test=dataset.x_test.to(device))
            datasets[key] = dataset
    if dataset.text == "tokens" and cfg.model.name == "text" and options["model"].freeze_encoder:
        dataset = _pooled(dataset)
    if cfg.data.augment and len(dataset.input_shape) != 3:
        raise ConfigError(
            f"data.augment: crops and flips images (channels, height, width); {cfg.data.name} has inputs of "
            f"shape {dataset.input_shape}; allowed: false with {cfg.data.name}"
        )
    partition = partition_dataset(
        dataset, cfg.partition.name, options["partition"], cfg.seed, cfg.partition.holdout, cfg.partition.val_share
    )
    notice = natural_groups_notice(dataset, cfg.partition.name, partition.num_clients,
                                   by_groups=bool(partition.options.get("by_groups")))
    if notice:
        say_once(notice)
    if cfg.output.tensorboard:
        summary_writer_class()  # a missing package is refused before anything is written
    return Prepared(cfg, options, dataset, partition, device)


def build_algorithm(prep: Prepared, model: FedModel) -> Algorithm:
    tc = prep.config.train
    held = torch.as_tensor(prep.partition.holdout, dtype=torch.int64)
    buffers = {k: v.detach().to(prep.device) for k, v in model.named_buffers()}
    setup = Setup(
        num_classes=prep.dataset.num_classes,
        num_clients=prep.partition.num_clients,
        feature_dim=model.feature_dim,
        lr=tc.lr,
        momentum=tc.momentum,
        weight_decay=tc.weight_decay,
        clip_grad_norm=tc.clip_grad_norm,
        seed=prep.config.seed,
        projection_dim=model.projection_dim,
        batch_size=tc.batch_size,
        apply=make_apply(model.to(prep.device), buffers, prefers_channels_last(model, prep.device), prep.dataset.prepare),
        holdout_x=prep.dataset.x_train[held].to(prep.device) if len(held) else None,
        holdout_y=prep.dataset.y_train[held].to(prep.device) if len(held) else None,
    )
    entry = ALGORITHMS.get(prep.config.algorithm.name, "algorithm.name")
    options = prep.options["algorithm"]
    algorithm = entry.factory(options, setup)

    def at_values(values: Mapping[str, Any]) -> Algorithm:
        """The same factory at other values: ``train.lr`` as ``Setup.lr``, the others as options
        (set on a copy unvalidated: under a stack's vmap they are tensors, engine.step_values)."""
        changed = {k: v for k, v in values.items() if k != LR}
        hp = with_options(options, **changed) if changed else options
        return entry.factory(hp, dataclasses.replace(setup, lr=values.get(LR, setup.lr)))

    # under a schedule, round t runs the algorithm built at its lr (RoundTools.at_round): the
    # same factory and options, Setup.lr = train.lr_at(t), so every hook that reads the lr
    # (local steps, SCAFFOLD's controls, SlowMo's and FedADC's server steps) reads the round's
    return dataclasses.replace(algorithm, at_values=at_values, value_keys=tuple(entry.space or {}))


def build_run(prep: Prepared) -> tuple[FedModel, Algorithm]:
    """The run's model and algorithm, and the checks that need them both: what a run refuses
    here it refuses before anything is written (``fedrift compare`` calls it per setting)."""
    cfg = prep.config
    cohort_size(prep.partition.num_clients, cfg.train.clients_per_round, cfg.train.participation)
    model = build_model(cfg.model.name, prep.options["model"], prep.dataset.input_shape, prep.dataset.num_classes, cfg.seed)
    _check_text(prep, model)
    algorithm = build_algorithm(prep, model)
    if cfg.train.optimizer != "sgd" and (algorithm.optimizer is not None or algorithm.local_sgd):
        raise ConfigError(
            f"train.optimizer: {cfg.algorithm.name} runs its own local SGD (its math assumes it), so it cannot "
            f"train with {cfg.train.optimizer}; allowed: sgd with {cfg.algorithm.name}"
        )
    privacy.check(cfg, algorithm)
    if (algorithm.personal or algorithm.client_model is not None) and (cfg.eval.drift or cfg.eval.personalize):
        key = "eval.drift" if cfg.eval.drift else "eval.personalize"
        what = "personal models" if algorithm.personal else "models that keep a part of their own"
        raise ConfigError(
            f"{key}: {cfg.algorithm.name} trains {what} (there is no one global model to "
            f"compare or calibrate); allowed: false with {cfg.algorithm.name}"
        )
    return model, algorithm


def _pooled(dataset: Dataset) -> Dataset:
    """Token ids replaced by the frozen encoder's sentence embeddings, computed once
    (``models.text.encode_frozen``): the head-only model then trains on them."""
    from fedrift.models.text import encode_frozen

    return dataclasses.replace(dataset, x_train=encode_frozen(dataset.x_train), x_test=encode_frozen(dataset.x_test),
                               token_cut=None, text="pooled")


def _check_text(prep: Prepared, model: FedModel) -> None:
    """Token ids go to the text model only, and it takes nothing else."""
    name = prep.config.model.name
    if prep.dataset.text is not None and not model.takes_tokens:
        raise ConfigError(f"model.name: {name} cannot read the token ids of {prep.config.data.name}; allowed: text")
    if model.takes_tokens and prep.dataset.text is None:
        raise ConfigError(f"data.name: model {name} reads token ids; {prep.config.data.name} has none; allowed: sst5, agnews, hf with a text column")


def build_tools(prep: Prepared, model: FedModel, algorithm: Algorithm) -> RoundTools:
    """The run's training tools (``apply``, the local step, the optimiser) on its device."""
    cfg = prep.config
    x, y = prep.dataset.x_train.to(prep.device), prep.dataset.y_train.to(prep.device)
    return make_tools(model.to(prep.device), algorithm, cfg.train, x, y, cfg.seed, cfg.eval.batch_size,
                      prep.dataset.prepare, Augment.from_config(cfg.data), cfg.privacy)


def client_tools(config: Config | Prepared) -> RoundTools:
    """A client side's tools rebuilt from the run's config (or its prepared pieces), as the
    server built them: what a ``processes`` worker, a Ray actor or a Flower client trains with.
    Plugins load first: the algorithm may be a plugin's."""
    if isinstance(config, Prepared):  # unpickled where it is used: its plugins may not be loaded yet
        load_plugins(config.config.plugins)
        prep = config
    else:
        prep = prepare(config)  # loads the config's plugins
    set_cudnn_choice(prep.config)  # a worker's process trains this run's clients alone
    model, algorithm = build_run(prep)
    return build_tools(prep, model, algorithm)


def resolved_yaml(prep: Prepared) -> str:
    """The config as a run folder's ``config.yaml`` holds it: every section's options resolved."""
    return config_yaml(prep.config, prep.options)


def config_yaml(cfg: Config, options: Mapping[str, Any] | None = None) -> str:
    """``cfg`` as YAML with every section's options resolved (``options``: from
    :func:`resolve_options`, which validates them, read no data; ``fedrift config show``)."""
    options = resolve_options(cfg) if options is None else options
    return to_yaml(cfg, {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else {} for k, v in options.items()})


def run_folder(cfg: Config) -> Path:
    """Where the run writes: ``output.dir``, else a new folder under ``runs/`` named for the run."""
    if cfg.output.dir:
        return Path(cfg.output.dir)
    return auto_dir(Path("runs"), f"{cfg.algorithm.name}-{cfg.data.name}-{cfg.partition.name}-s{cfg.seed}")


def run_facts(prep: Prepared, model: FedModel, executor: str) -> dict[str, Any]:
    """What ``summary.json`` says the run was, beside its results (the caller adds ``threads``)."""
    cfg = prep.config
    return {"algorithm": cfg.algorithm.name, "dataset": cfg.data.name, "partition": cfg.partition.name,
            "model": cfg.model.name, "seed": cfg.seed, "num_clients": prep.partition.num_clients,
            "num_params": sum(p.numel() for p in model.parameters()), "executor": executor, "device": str(prep.device)}


def final_state(global_params: dict[str, torch.Tensor], model: FedModel) -> dict[str, torch.Tensor]:
    """The final global model's state_dict on the CPU: the aggregated parameters (and BatchNorm
    running statistics, ``models/norm.py``) and the model's other buffers."""
    buffers = {k: v for k, v in model.named_buffers() if k not in global_params}
    return {k: v.detach().cpu() for k, v in {**global_params, **buffers}.items()}
