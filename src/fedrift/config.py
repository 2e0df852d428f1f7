"""Config: YAML or dict + dotted overrides, validated once, at the edge.

Sections with a ``name`` (data, partition, model, algorithm) take that registry entry's own
options next to the name, e.g. ``algorithm: {name: fedprox, mu: 0.01}``; they are validated
against the entry's options class, so every key is checked. Any refusal is a
:class:`ConfigError` whose one-line message names the key and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedrift import yamlio
from fedrift.errors import ConfigError
from fedrift.overrides import parse_algorithm, parse_value
from fedrift.plugins import load_plugins

# allow_inf_nan=False: a float key refuses "inf" and "nan" given as text (an override's
# train.lr=inf) as it refuses a YAML .inf (see check_numbers)
_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Section(BaseModel):
    model_config = _STRICT


class NamedSection(BaseModel):
    """A registry choice plus that entry's options (validated later, per entry)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    name: str

    @property
    def options_dict(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class DataConfig(NamedSection):
    name: str = Field("mnist5k", description="the dataset: embedded (offline) or read from `data.root`")
    root: str | None = Field(None, description=(
        "folder for datasets read from disk (must exist when given; refused with an embedded dataset, "
        "which would ignore it)"))
    # local training batches: random crop with zero padding and horizontal flip (engine/augment.py)
    augment: bool = Field(False, description=(
        "random crop with zero padding and horizontal flip of every local training batch (images only)"))
    crop_padding: Annotated[int, Field(ge=0, description=(
        "pixels of padding on each side before the crop (0: no crop)"))] = 4
    flip: bool = Field(True, description="with `augment`: mirror left-right with probability 1/2")
    accept_changed: bool = Field(False, description=(
        "go on when a Flower SuperNode's data, or a resumed run's, differs from the data the run was "
        "built with (fingerprints: sample counts, labels, a hash of the rows), with a warning; false: refused"))


class PartitionConfig(NamedSection):
    name: str = Field("dirichlet", description="how the training set is split over the clients")
    # share of the training set the server keeps out of every client's data (FedDF's proxy)
    holdout: Annotated[float, Field(ge=0, lt=1, description=(
        "share of the training set the server keeps (stratified by class), in no client's data: FedDF's "
        "proxy and validation split"))] = 0.0
    # share of each client's training samples set aside for validation (model selection, tuning)
    val_share: Annotated[float, Field(ge=0, lt=1, description=(
        "share of each client's training samples set aside as its validation split (0: none, results as "
        "before bit for bit)"))] = 0.0


class ModelConfig(NamedSection):
    name: str = Field("cnn", description="the model")


class AlgorithmConfig(NamedSection):
    name: str = Field("fedavg", description="the algorithm")


PositiveInt = Annotated[int, Field(ge=1)]


class TrainConfig(_Section):
    rounds: PositiveInt = Field(50, description="communication rounds")
    clients_per_round: PositiveInt | None = Field(None, description=(
        "clients sampled per round (a count), or give `participation`"))
    participation: Annotated[float, Field(gt=0, le=1)] | None = Field(None, description=(
        "clients sampled per round as a fraction C in (0, 1]; neither this nor `clients_per_round` given:"
        " C = 0.2"))
    local_epochs: PositiveInt = Field(5, description=(
        "local epochs per round (each a fresh permutation, last small batch kept)"))
    local_steps: PositiveInt | None = Field(None, description="a fixed number of local steps instead of epochs")
    batch_size: PositiveInt = Field(32, description="local batch size")
    lr: Annotated[float, Field(gt=0, description="local learning rate")] = 0.05
    momentum: Annotated[float, Field(ge=0, lt=1, description="local SGD momentum, reset every round")] = 0.9
    weight_decay: Annotated[float, Field(ge=0, description="added to the gradient, as torch.optim.SGD does")] = 1.0e-5
    clip_grad_norm: Annotated[float, Field(gt=0)] | None = Field(None, description=(
        "clip each local gradient to this global norm (null: no clipping)"))
    optimizer: Literal["sgd", "adamw"] = Field("sgd", description=(
        "local optimiser: `sgd`, or `adamw` (torch's AdamW: betas 0.9/0.999, eps 1e-8, `weight_decay` "
        "decoupled, moments reset every round; `momentum` unused); SCAFFOLD, SlowMo, FedADC and FedNova "
        "assume local SGD and refuse `adamw`"))  # the local optimiser (functional/optim.py)
    # the local learning rate per round (lr_at): constant (train.lr), step (times lr_gamma at
    # each of lr_milestones) or cosine (from train.lr down towards lr_min over the rounds)
    lr_schedule: Literal["constant", "step", "cosine"] = Field("constant", description=(
        "the lr of round t: `constant` (`lr`), `step` (times `lr_gamma` from each of `lr_milestones`) or "
        "`cosine` (from `lr` towards `lr_min`)"))
    lr_milestones: list[PositiveInt] = Field([], description=(
        "`step`: rounds from which the lr is multiplied by `lr_gamma` (e.g. [50, 75])"))  # step: the rounds from which the lr is multiplied by lr_gamma
    lr_gamma: Annotated[float, Field(gt=0, le=1, description=(
        "`step`: the factor at each milestone"))] = 0.1  # step: the factor at each milestone
    lr_min: Annotated[float, Field(ge=0, description=(
        "`cosine`: the lr it decays towards"))] = 0.0  # cosine: the floor of the decay
    precision: Literal["fp32", "bf16"] = Field("fp32", description=(
        "local training's arithmetic: `fp32` (the default, and the exact one: executors agree as stated), or "
        "`bf16` (the forward and backward passes under bfloat16 autocast, parameters, optimiser and "
        "aggregation in float32; for a GPU's tensor cores; evaluation stays fp32)"))

    @model_validator(mode="after")
    def _one_cohort_size(self) -> "TrainConfig":
        if self.clients_per_round is not None and self.participation is not None:
            raise ValueError(
                "train.clients_per_round and train.participation both set; allowed: one of them"
            )
        return self

    @model_validator(mode="after")
    def _schedule_keys(self) -> "TrainConfig":
        """Each schedule's own keys, and only those: a key another schedule reads is refused
        when set away from its default (its default is what a resolved config.yaml holds)."""
        own = {"lr_milestones": ("step", []), "lr_gamma": ("step", 0.1), "lr_min": ("cosine", 0.0)}
        for key, (schedule, default) in own.items():
            if self.lr_schedule != schedule and getattr(self, key) != default:
                raise ValueError(
                    f"train.{key}: used by train.lr_schedule {schedule} only, and this run's is "
                    f"{self.lr_schedule}; allowed: train.lr_schedule={schedule}, or leave train.{key} unset"
                )
        ms = self.lr_milestones
        if self.lr_schedule == "step":
            if not ms:
                raise ValueError("train.lr_milestones: lr_schedule step needs at least one round, e.g. train.lr_milestones=[50,75]")
            if any(b <= a for a, b in zip(ms, ms[1:])):
                raise ValueError(f"train.lr_milestones: {ms} must increase strictly; allowed: rounds in increasing order")
            if ms[-1] > self.rounds:
                raise ValueError(f"train.lr_milestones: round {ms[-1]} is after the last round ({self.rounds}); "
                                 f"allowed: rounds 1 to train.rounds")
        if self.lr_schedule == "cosine" and self.lr_min > self.lr:
            raise ValueError(f"train.lr_min: {self.lr_min} is above train.lr ({self.lr}); allowed: 0 to train.lr")
        return self

    def lr_at(self, round_: int) -> float:
        """The local learning rate of round ``round_`` (1-based): a pure function of this
        section and the round, so every executor, process and device derives the same one,
        and a checkpoint needs none. ``step``: ``lr * lr_gamma ** k``, ``k`` the milestones at or
        before the round. ``cosine``: ``lr_min + (lr - lr_min) (1 + cos(pi (t - 1) / R)) / 2``
        (``R = rounds``), computed as ``lr - (lr - lr_min) (1 - cos(pi (t - 1) / R)) / 2``: the
        same value, and round 1 is ``lr`` exactly."""
        if self.lr_schedule == "step":
            return self.lr * self.lr_gamma ** sum(1 for m in self.lr_milestones if m <= round_)
        if self.lr_schedule == "cosine":
            return self.lr - (self.lr - self.lr_min) * (1.0 - math.cos(math.pi * (round_ - 1) / self.rounds)) / 2.0
        return self.lr


class EngineConfig(_Section):
    executor: str = Field("auto", description=(
        "how a round's clients are trained: `auto` picks per run (recorded in `summary.json`)"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "`auto` (a GPU when torch sees one), `cpu` or `cuda`"))
    sampling: str = Field("uniform", description=(
        "how a round's clients are drawn: `uniform`, or `class_coverage` (the round's clients hold every "
        "class between them)"))
    sampling_retries: PositiveInt = Field(100, description=(
        "draws tried by `class_coverage` before randomised greedy covers"))
    teacher_cache: bool = Field(True, description=(
        "distillation teachers' outputs computed once per round, not on every batch; a model that stays a"
        " teacher (FedGKD-Vote's buffer) is not run again on samples it has seen (kept up to 256 MB); off"
        " with `data.augment`"))  # distillation teachers' outputs computed once per round
    max_parallel_clients: PositiveInt | None = Field(None, description=(
        "`batched` and `stacked`: clients per `vmap` call (null: from a memory budget, at most 256 on a CPU "
        "and 4,096 on a GPU)"))  # batched: clients per vmap call (None: from memory)
    cuda_graphs: bool = Field(True, description=(
        "`batched` and `stacked` on a GPU: each vectorised step replayed as a captured CUDA graph (one launch, "
        "not one per operation; groups padded to a few widths); false: launched op by op. No effect on a CPU"))
    compile: bool = Field(False, description=(
        "`batched` and `stacked`: the vectorised step's model call (its stacked form: the ResNets, the CNNs, "
        "the MLP, logreg) compiled by `torch.compile`, forward and backward; a compile per group width (tens of "
        "seconds each on a CPU, kept in torch's cache on disk), then faster steps; results within float "
        "rounding of uncompiled ones. Refused where the step has no stacked form"))
    cudnn_benchmark: bool = Field(False, description=(
        "on a GPU: cuDNN times its algorithms for each convolution shape the run meets and keeps the fastest "
        "(`torch.backends.cudnn.benchmark`, for the run's duration), where by default it picks by heuristics; "
        "the pick may differ from one process to the next, and the float rounding with it. No effect on a CPU"))
    threads: PositiveInt | None = Field(None, description=(
        "torch CPU threads for the run (restored afterwards; null: torch's default, one per core)"))
    client_state: Literal["memory", "disk", "auto"] = Field("auto", description=(
        "per-client state in `memory` or in a sparse file on `disk` (`auto`: disk above 1 GiB)"))  # per-client state store; auto: disk above 1 GiB
    workers: PositiveInt | None = Field(None, description=(
        "`processes`: worker processes; `ray`: actors (null: the CPUs available, or the cluster's)"))  # processes: worker processes, ray: actors (None: the CPUs available)
    ray_address: str | None = Field(None, description=(
        "`ray`: `host:port` of an existing cluster's head node (null: a local Ray for the run)"))  # ray: an existing cluster's address (None: a local Ray for the run)
    # client failures (engine/failures.py), each a pure function of (seed, round, client)
    dropout: Annotated[float, Field(ge=0, lt=1, description=(
        "probability that a sampled client never returns"))] = 0.0  # probability that a sampled client never returns
    stragglers: Annotated[float, Field(ge=0, le=1, description=(
        "probability that a returning client completes only part of its local steps"))] = 0.0  # probability that a client stops its work early
    straggler_work: Annotated[float, Field(gt=0, lt=1)] | Literal["uniform"] = Field(0.5, description=(
        "share of its local steps a straggler runs (at least one), or `uniform` (a share drawn per "
        "client)"))  # share of its steps a straggler runs
    accept_failures: bool = Field(False, description=(
        "a client whose training raises or whose loss or upload is not finite is left out of the round "
        "with a warning (false: the run stops); non-finite losses end the run as diverged once its rounds"
        " are done"))  # a client that raises or uploads non-finite values: left out (true) or the run stops
    # finite blow-ups (engine/failures.py DivergenceBound): treated as a non-finite loss is
    divergence_factor: Annotated[float, Field(gt=1)] | None = Field(1000.0, description=(
        "a client whose training loss or update norm exceeds this many times the run's first round's (the "
        "median over its clients; a loss taken as at least 1) diverged: the run stops `diverged` with its "
        "metrics kept, or under `accept_failures` the client is left out and counted (null: no such bound)"))
    divergence_loss: Annotated[float, Field(gt=0)] | None = Field(None, description=(
        "an absolute bound on a client's training loss, from round 1, with the same effect (null: none)"))
    # rounds between checkpoints (fedrift run --resume continues from the last); 0: none
    checkpoint_every: Annotated[int, Field(ge=0, description=(
        "rounds between checkpoints in `output.dir/checkpoint/` (0: none); `fedrift run --resume DIR` "
        "continues from the last"))] = 10

    @model_validator(mode="after")
    def _compile(self) -> "EngineConfig":
        """``engine.compile`` is read by the vectorised executors alone (``auto`` is checked
        once it is resolved: ``fedrift.api``)."""
        if self.compile and self.executor in ("sequential", "processes", "ray"):
            raise ValueError(f"engine.compile: true is read by engine.executor batched and stacked only, and this "
                             f"run's is {self.executor}; allowed: engine.executor=batched or stacked, or "
                             "engine.compile=false")
        return self

    @model_validator(mode="after")
    def _ray_address(self) -> "EngineConfig":
        """``engine.ray_address``: HOST:PORT (or ray://HOST:PORT), and only under the ray executor,
        which alone reads it: a key no executor reads is refused, not ignored."""
        address = self.ray_address
        if address is None:
            return self
        host, sep, port = address.removeprefix("ray://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"engine.ray_address: {address!r} is not HOST:PORT; allowed: the address of a Ray head "
                             "node's GCS, e.g. 10.0.0.5:6379 (ray start --head prints it; port 6379 by default), "
                             "ray://HOST:PORT for Ray Client, or null for a local Ray")
        if self.executor != "ray":
            raise ValueError(f"engine.ray_address: {address!r} is read by engine.executor ray only, and this run's is "
                             f"{self.executor}; allowed: engine.executor=ray, or engine.ray_address=null")
        return self


class EvalConfig(_Section):
    every: PositiveInt = Field(1, description="evaluate the global model every N rounds (and always after the last)")
    # rows per inference pass (evaluation, teacher tables); None: 128 for convolutional models
    # on the CPU (fastest there, channels-last), 1024 otherwise (fewer calls for small models)
    batch_size: PositiveInt | None = Field(None, description=(
        "rows per inference pass (evaluation, teacher tables); null: 128 for convolutional models on the "
        "CPU, 1024 otherwise"))
    at_rounds: list[PositiveInt] = Field([], description=(
        "accuracy at these rounds goes into `summary.json` (`accuracy_at`)"))  # accuracy at these rounds goes in the summary
    drift: bool = Field(False, description=(
        "drift diagnostics each evaluated round: the local models' accuracy, logit KL and feature "
        "distance to the global model"))  # local models' accuracy, logit and feature distance to the global model
    probe_size: PositiveInt = Field(256, description=(
        "test samples on which logit and feature distances are measured"))  # test samples on which logit/feature distances are taken
    personalize: bool = Field(False, description=(
        "after training, calibrate each client's classifier on its data and test it on its local split"))  # after training, fine-tune each client's classifier, test locally
    personalize_epochs: PositiveInt = Field(2, description="local epochs of that calibration (E_p)")
    personalize_loss: Literal["ce", "algorithm"] = Field("ce", description=(
        "`ce` (cross-entropy) or `algorithm`: the run's own loss only, never its update rule"))
    personalize_mu: Annotated[float, Field(ge=0, description=(
        "adds `mu/2 ||w - w_global||^2` to either calibration loss"))] = 0.0
    personalize_lr: Annotated[float | None, Field(gt=0, description=(
        "the learning rate of that fine-tuning (default: `train.lr`); a whole model fine-tuned at a "
        "training rate tuned with its head frozen can collapse"))] = None
    personalize_part: Literal["head", "all"] = Field("head", description=(
        "what the fine-tuning moves: `head`, the classifier alone (FedADC's calibration), or `all`, "
        "the whole model (FedBABU's fine-tuning)"))
    per_client_test: Literal["every", "at_rounds"] = Field("every", description=(
        "methods with a model per client: each client's model on the whole test set and validation union "
        "(`test_accuracy`, `val_accuracy`: a pass over each per client) at every evaluated round, or only at "
        "`eval.at_rounds` and the last round (`at_rounds`); the local accuracies, each client's model on its "
        "own samples, at every evaluated round either way"))
    # personal models' metrics, local_accuracy and personalisation: every client up to this
    # many clients, else this many drawn once by the seed (the same clients every round)
    clients_sample: PositiveInt = Field(1000, description=(
        "personal models' metrics, `local_accuracy` and `eval.personalize` cover every client up to this "
        "many clients; above it, this many clients drawn once by the seed (the same panel every round)"))


class PrivacyConfig(_Section):
    """Differential privacy (engine/privacy.py): ``client`` level (DP-FedAvg, McMahan et al.
    2018) or ``sample`` level (DP-SGD in local training); epsilon at ``delta`` from dp-accounting."""

    level: Literal["none", "client", "sample"] = Field("none", description=(
        "`client` (DP-FedAvg: clip each model change, noise on the sum) or `sample` (DP-SGD in local "
        "training)"))
    clip: Annotated[float, Field(gt=0)] | None = Field(1.0, description=(
        "S (client level: norm of a client's model change) or C (sample level: norm of a sample's "
        "gradient); null: no clipping (then no noise)"))  # S (client) or C (sample); null: no clipping
    noise_multiplier: Annotated[float, Field(ge=0, description=(
        "z: Gaussian noise of std z x clip (on the sum of clipped changes or of clipped gradients)"))] = 1.0  # z: noise std is z x clip
    delta: Annotated[float, Field(gt=0, lt=1, description="epsilon is reported at this delta")] = 1.0e-5

    @model_validator(mode="after")
    def _noise_needs_clip(self) -> "PrivacyConfig":
        if self.level != "none" and self.clip is None and self.noise_multiplier > 0:
            raise ValueError(
                "privacy.clip: null (no clipping) leaves the noise without a scale; allowed: a positive "
                "clip, or privacy.noise_multiplier 0"
            )
        return self


class OutputConfig(_Section):
    dir: str | None = Field(None, description=(
        "the run folder (null: `runs/<algorithm>-<data>-<partition>-s<seed>-<time>`)"))
    overwrite: bool = Field(False, description="an existing run folder is refused unless this is true")
    progress: bool = Field(True, description="progress bar with the current accuracy (on a terminal)")
    save_model: bool = Field(True, description="write `final_model.pt`")
    tensorboard: bool = Field(False, description=(
        "TensorBoard event files in `output.dir/tensorboard/` (needs the `tensorboard` extra)"))  # event files in output.dir/tensorboard (needs the tensorboard extra)


class Config(_Section):
    seed: Annotated[int, Field(ge=0, description=(
        "seeds model init, client sampling, batch order and the partition"))] = 0
    # modules imported before the rest is validated: they register their own algorithms,
    # models, datasets and partitions (fedrift.plugins; installed entry points load anyway)
    plugins: list[str] = Field([], description=(
        "your modules to import first, which register algorithms, models, datasets and partitions "
        "(`plugins=[my_pkg.fl]` on the command line)"))
    data: DataConfig = Field(DataConfig(), description="the dataset: a `name` plus that dataset's own options")
    partition: PartitionConfig = Field(PartitionConfig(), description=(
        "how the training set is split over clients: a `name` plus that partition's own options"))
    model: ModelConfig = Field(ModelConfig(), description="the model: a `name` plus that model's own options")
    algorithm: AlgorithmConfig = Field(AlgorithmConfig(), description=(
        "the algorithm: a `name` plus that algorithm's own options"))
    train: TrainConfig = Field(TrainConfig(), description="rounds, cohort and local training")
    engine: EngineConfig = Field(EngineConfig(), description=(
        "how the rounds run: executor, device, sampling, failures, checkpoints"))
    eval: EvalConfig = Field(EvalConfig(), description="evaluation and diagnostics")
    privacy: PrivacyConfig = Field(PrivacyConfig(), description="differential privacy")
    output: OutputConfig = Field(OutputConfig(), description="the run folder")

    @model_validator(mode="before")
    @classmethod
    def _finite(cls, data: Any) -> Any:
        """No inf or nan anywhere in the document, a named section's options included (their
        entries' classes check them again, typed: :func:`validate_options`)."""
        if isinstance(data, Mapping):
            check_numbers(data, "", counts=False)
        return data

    @model_validator(mode="after")
    def _bounded(self) -> "Config":
        """Every number of the validated config within its kind's bounds (:func:`check_numbers`)."""
        check_numbers(self, "")
        return self


# ---------------------------------------------------------------------------------------
# Bounds on every number (issue 68, F16), checked in one place: for the whole config by
# Config's two validators above, for a registry entry's options by validate_options; a new key
# is covered without a bound of its own. Refusals are ConfigErrors naming the key, the value
# and what is allowed.
#
# Floats: finite. No key gives inf or nan a meaning ("no limit" is null: train.clip_grad_norm,
# privacy.clip, engine.divergence_factor and divergence_loss), so an inf or a nan is a typo or
# an overflow (a YAML 1e999).
# Integers, by kind:
# - seeds (``seed``, ``*_seed``: the run's, a dataset's split_seed, subset_seed...): 0 to
#   2**63 - 1. numpy's generators refuse a negative seed (a traceback deep in the data, before),
#   torch's manual_seed stops at 2**64 - 1, and a seed is written to summary.json and read back
#   by the reports into int64 columns: int64's range, non-negative.
# - every other integer is a count or a size (rounds, epochs, steps, clients, batch sizes,
#   samples, widths, milestones): at most 10**9 in magnitude. 10**9 < 2**31, so a count fits
#   every index type the engine meets (an int32 index tensor, a 32-bit CUDA kernel index), and
#   a product of a few (rounds x clients x steps, the keys of the per-step generators; samples
#   x epochs) stays far inside int64; no run comes near a billion rounds or clients, while a
#   typo's 10**23 was accepted and became a loop that never ends or an allocation that fails.
COUNT_MAX = 10**9
SEED_MAX = 2**63 - 1


def check_numbers(value: Any, key: str, counts: bool = True) -> None:
    """Refuse an inf or a nan anywhere in ``value`` (a validated config or options object, or a
    plain document of mappings and lists) and, where ``counts``, an integer outside its kind's
    bounds: a typed value's integers are integer keys' (a plain document's may be a float key's
    ``10``, so its integers wait until they are typed). ``key``: the dotted key of ``value``."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{key or 'config'}: {value} is not a finite number; allowed: a finite number (no inf or nan)")
        return
    if isinstance(value, int):
        if counts:
            _check_int(value, key)
        return
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            check_numbers(getattr(value, name), _dotted(key, name), counts)
        for name, extra in (value.model_extra or {}).items():  # a named section's options: untyped here
            check_numbers(extra, _dotted(key, str(name)), counts=False)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            check_numbers(getattr(value, f.name), _dotted(key, f.name), counts)
    elif isinstance(value, Mapping):
        for name, item in value.items():
            check_numbers(item, _dotted(key, str(name)), counts)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            check_numbers(item, key, counts)


def _check_int(value: int, key: str) -> None:
    last = key.rsplit(".", 1)[-1]
    if last in ("seed", "seeds") or last.endswith("_seed"):  # seeds: a study's or a grid's list
        if not 0 <= value <= SEED_MAX:
            raise ConfigError(f"{key}: {_shown(value)} is not a seed; allowed: a whole number from 0 to "
                              f"{SEED_MAX} (2**63 - 1)")
    elif value > COUNT_MAX:
        raise ConfigError(f"{key}: {_shown(value)} is too large; allowed: at most {COUNT_MAX} (10**9)")
    elif value < -COUNT_MAX:
        raise ConfigError(f"{key}: {_shown(value)} is too small; allowed: at least -{COUNT_MAX} (-10**9)")


def _shown(value: int) -> str:
    """An integer as given, or its first digits and length when it runs past a line."""
    text = str(value)
    return text if len(text) <= 40 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"


def _dotted(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


# ---------------------------------------------------------------------------------------
# Loading and overrides


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a folder; allowed: a YAML file, e.g. -c examples/demo.yaml")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        with p.open() as f:
            doc = yamlio.load(f)  # from the file object: errors name the file, not "<unicode string>"
    except yamlio.DuplicateKeyError as err:  # one line already: FILE line N: key 'lr' appears twice ...
        raise ConfigError(str(err)) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_one_line(err)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text; allowed: a YAML file") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
    return doc


NAMED_SECTIONS = ("data", "partition", "model", "algorithm")
# (section, old name, new name) -> the options both entries declare (kept when the name changes)
SharedOptions = Callable[[str, str, str], "set[str]"]


def apply_overrides(doc: Mapping[str, Any], overrides: list[str], shared: SharedOptions | None = None) -> dict[str, Any]:
    """Apply ``a.b.c=value`` pairs; values are parsed as YAML scalars or lists.

    An override that changes a named section's ``name`` (``algorithm.name=fedavg`` over a
    file's ``algorithm: {name: fedprox, mu: 0.01}``) drops the options the document gave for
    the old entry: they are that entry's. Kept: the section's own keys (``data.root``,
    ``partition.holdout``), options given by an earlier override, and those ``shared`` says
    both entries declare (``partition.num_clients``, ``algorithm.aggregation``).
    """
    out = copy.deepcopy(dict(doc))
    given: set[str] = set()  # keys set by these overrides (never dropped)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.rounds=10)")
        value = parse_value(raw, f"override {item!r}")
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                prefix = ".".join(parts[: i + 1])
                raise ConfigError(f"override {item!r}: {prefix} is a value, not a section")
            node = child
        if len(parts) == 2 and parts[0] in NAMED_SECTIONS and parts[1] == "name":
            _drop_old_options(parts[0], node, value, given, shared)
        node[parts[-1]] = value
        given.add(key)
    return out


def _drop_old_options(section: str, node: dict[str, Any], new: Any, given: set[str], shared: SharedOptions | None) -> None:
    """Remove from ``node`` (the section) the old entry's options when its name changes to ``new``."""
    cls = Config.model_fields[section].annotation
    old = node.get("name", cls.model_fields["name"].default)
    if str(old) == str(new):
        return
    keep = set(cls.model_fields) | (shared(section, str(old), str(new)) if shared else set())
    for k in [k for k in node if k not in keep and f"{section}.{k}" not in given]:
        del node[k]


def config_dict(config: "Config | Mapping[str, Any] | str | Path | None") -> dict[str, Any]:
    """A config given as a Config, a mapping or a YAML path (or None: empty), as a dict to
    apply overrides to: what the experiments expand their grids from."""
    if config is None:
        return {}
    if isinstance(config, Config):
        return config.model_dump()
    if isinstance(config, (str, Path)):
        return read_yaml(config)
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise ConfigError(f"config must be a dict or a YAML path, got {type(config).__name__}")


def entry_doc(base: Mapping[str, Any], entry: str) -> dict[str, Any]:
    """The config of one algorithm entry of an experiment (``fedprox:mu=0.1``,
    ``moon:mu=5:model.projection_dim=256``): ``base`` with the entry's algorithm and options;
    the file's algorithm options are kept only when the file names the same algorithm (they
    belong to it)."""
    name, opts = parse_algorithm(entry)
    doc = copy.deepcopy(dict(base))
    if str((doc.get("algorithm") or {}).get("name", "fedavg")) != name:
        doc["algorithm"] = {"name": name}
    return apply_overrides(doc, [f"algorithm.name={name}", *opts])


def load_config(
    source: "Config | Mapping[str, Any] | str | Path | None" = None,
    overrides: list[str] | None = None,
    shared: SharedOptions | None = None,
) -> Config:
    """Validate a config from a Config, dict, or YAML path, plus dotted overrides
    (``shared``: see :func:`apply_overrides`; ``fedrift.run`` passes the registries')."""
    if isinstance(source, Config):
        if not overrides:
            load_plugins(source.plugins)
            return source
        source = source.model_dump()
    if source is None:
        doc: dict[str, Any] = {}
    elif isinstance(source, (str, Path)):
        doc = read_yaml(source)
    elif isinstance(source, Mapping):
        doc = dict(source)
    else:
        raise ConfigError(f"config must be a dict or a YAML path, got {type(source).__name__}")
    doc = apply_overrides(doc, overrides or [], shared)
    if "plugins" in doc:
        doc["plugins"] = plugin_list(doc["plugins"])
    load_plugins(doc.get("plugins") or [])  # before validation: they add names it checks against
    try:
        cfg = Config.model_validate(doc)
    except ValidationError as err:
        raise ConfigError(_describe(err, Config)) from None
    return _check_paths(cfg)


def plugin_list(value: Any) -> list[str]:
    """``plugins`` as a list of module names: a YAML list, or one string with commas."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(m, str) and m.strip() for m in items):
        raise ConfigError(
            f"plugins: {value!r} is not a list of module names; allowed: e.g. plugins=[my_pkg.algos,my_pkg.data]"
        )
    return [m.strip() for m in items]


def _check_paths(cfg: Config) -> Config:
    """Refuse a ``data.root`` that does not exist; a relative one becomes absolute (see
    :func:`absolute_root`), so that the run folder's ``config.yaml`` names the same data from
    wherever the run is resumed."""
    root = cfg.data.root
    if root is None:
        return cfg
    if not Path(root).expanduser().exists():
        if cfg.data.name == "hf" and not root.startswith(("/", ".", "~")):
            return cfg  # perhaps a Hub name: the hf loader says how to save a local copy
        raise ConfigError(f"data.root: {root!r} does not exist; expected a folder (or a .zip for image trees, a .npz for npz)")
    if absolute_root(root) == root:
        return cfg
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"root": absolute_root(root)})})


def absolute_root(root: str) -> str:
    """A relative ``data.root`` as the absolute path it means from the current folder (no
    symbolic link resolved: the path as the user would write it); an absolute one, or one
    from the home folder (``~/data``: the same folder wherever the command runs, and a config
    that travels to another user), as given."""
    if root.startswith("~") or Path(root).is_absolute():
        return root
    return os.path.abspath(root)


def same_root(a: Any, b: Any) -> bool:
    """Whether two ``data.root`` values name the same path seen from here: a run folder's
    config.yaml written before roots were stored absolute holds the relative one."""
    if not isinstance(a, str) or not isinstance(b, str):
        return a == b
    return os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))


def validate_options(section: str, params_cls: type | None, options: dict[str, Any]) -> Any:
    """Build a registry entry's options object from a section's extra keys. An unknown key is
    refused naming every key the section takes: its own (``name``, ``data.root`` ...), then
    the entry's options (a misspelt ``name`` is such an extra key too)."""
    own = [k for k in _fields(_fields(Config).get(section)) if k != "name"] if section in _fields(Config) else []
    own = ["name", *sorted(own)]
    if params_cls is None:
        if options:
            raise ConfigError(f"{section}.{next(iter(options))}: unknown key; allowed: {', '.join(own)} "
                              f"(this {section} takes no options of its own)")
        return None
    check_numbers(options, section, counts=False)  # an inf or a nan: before the entry's own bounds' messages
    try:
        obj = params_cls(**options)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] in ("extra_forbidden", "unexpected_keyword_argument") and len(first["loc"]) == 1:
            allowed = [*own, *(k for k in sorted(_fields(params_cls)) if k not in own)]
            raise ConfigError(f"{section}.{first['loc'][0]}: unknown key; allowed: {', '.join(allowed)}") from None
        raise ConfigError(_describe(err, params_cls, prefix=section)) from None
    except TypeError as err:  # pragma: no cover - pydantic reports bad keys itself
        raise ConfigError(f"{section}: {err}") from None
    check_numbers(obj, section)  # typed now: an inf from text ("inf"), integers by kind
    return obj


# ---------------------------------------------------------------------------------------
# Error messages


def _describe(err: ValidationError, root: type, prefix: str = "") -> str:
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"]]
    key = ".".join([prefix, *loc] if prefix else loc) or prefix or "config"
    kind = first["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        allowed = _allowed_keys(root, [str(p) for p in first["loc"][:-1]])
        return f"{key}: unknown key; allowed: {', '.join(allowed)}"
    if kind == "value_error":
        msg = str(first.get("ctx", {}).get("error", first["msg"]))
        return msg if "." in msg.split(" ")[0] else f"{key}: {msg}"
    got = first.get("input")
    if kind == "finite_number" or (kind in _FLOAT_ERRORS and _non_finite(got)):  # "inf", "nan", 1e999, 10**400
        shown_got = _shown(got) if isinstance(got, int) else got
        key = ".".join(p for p in key.split(".") if "-" not in p and "[" not in p)  # less a union's tag: constrained-float
        return f"{key}: {shown_got} is not a finite number; allowed: a finite number (no inf or nan)"
    if kind == "int_parsing_size":  # 1.0e+30 for an integer key
        if isinstance(got, (int, float)) and got < 0:
            return f"{key}: {got} is too small; allowed: at least -{COUNT_MAX} (-10**9)"
        return f"{key}: {got} is too large; allowed: at most {COUNT_MAX} (10**9)"
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    if kind in ("model_type", "model_attributes_type", "dataclass_type", "dict_type"):  # a section given a value
        return f"{key}: must be a section of keys (a mapping){shown}"
    return f"{key}: {first['msg'].lower()}{shown}"


# a float key's refusals: of a nan (it fails every bound), of an integer past float's range
_FLOAT_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of", "float_type")


def _non_finite(got: Any) -> bool:
    """Whether a refused value reads as an inf or a nan as a float (10**400 does: float's inf)."""
    if isinstance(got, bool) or not isinstance(got, (int, float, str)):
        return False
    try:
        return not math.isfinite(float(got))
    except OverflowError:
        return True
    except ValueError:
        return False


def _allowed_keys(root: type, path: list[str]) -> list[str]:
    cls: Any = root
    for part in path:
        fields = _fields(cls)
        if part not in fields:
            return sorted(fields)
        ann = fields[part]
        cls = ann if isinstance(ann, type) else None
        if cls is None:
            return []
    return sorted(_fields(cls))


def _fields(cls: Any) -> dict[str, Any]:
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {k: f.annotation for k, f in cls.model_fields.items()}
    dc_fields = getattr(cls, "__pydantic_fields__", None) or getattr(cls, "__dataclass_fields__", {})
    return {k: getattr(f, "annotation", getattr(f, "type", None)) for k, f in dc_fields.items()}


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def to_yaml(cfg: Config, resolved_options: Mapping[str, Any] | None = None) -> str:
    """The resolved config as YAML, named sections carrying their full options."""
    doc = cfg.model_dump(mode="json")
    for section, options in (resolved_options or {}).items():
        doc[section] = {"name": doc[section]["name"], **{k: v for k, v in doc[section].items() if k != "name"}, **options}
    return yamlio.dump(doc)
