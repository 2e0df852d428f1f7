"""What an algorithm is: a frozen value of small pure hook functions.

The engine owns the loop and calls these hooks; every executor (sequential now, batched
with ``torch.func.vmap``, processes, Ray, Flower) runs the same ones. A round is::

    payload = broadcast(server_state, info)                    # what goes down, per client
    [summaries -> pre_combine]                                 # optional pre-phase (FedCSD, Vote)
    for each sampled client k (in any executor):
        ctx   = engine facts (num_samples, num_steps, label_counts, client state)
        ctx  |= client_start(payload, ctx, data_k, apply)      # once per client per round
        batch["teacher"] = teacher(payload, x, apply)          # per sample; cached once a round
        for each step: grads = grad(local_loss)(params, batch, payload, ctx, apply)
                       grads = grad_correction(grads, params, payload, ctx)
                       params, opt = optimizer.update(...)     # functional SGD by default
        ctx  |= client_end(payload, params, ctx, data_k, apply)  # once, after training
        upload, state_k = client_result(payload, params, ctx)
    server_state = aggregate(server_state, stacked uploads, p, info)

Streamed aggregation: an algorithm whose aggregate reads the uploads only through weighted
sums ``sum_k c_k upload_k[field]`` (FedAvg, FedGKD, FedADC, SlowMo, FedAvgM, SCAFFOLD) gives ``sums`` (field -> ``"weights"``,
the round's p_k, or ``"uniform"``, 1/K) and ``aggregate_sums(state, sums, info)`` instead of
``aggregate``. The engine then folds each upload into running sums as it arrives, so a round
holds one client's upload instead of a stack of K (S4), and derives ``aggregate`` for the
executors that return a whole round at once: the same sums, bit for bit (``RunningSum``).

Personal models (``personal=True``, FedProto): a client starts from its own model,
``ctx["state"]["params"]``, not from the payload (which then need not carry parameters),
and evaluation reports the mean over clients of their own models' accuracy, on the global
test set and on each client's local split, plus any extra predictions ``predict`` names
(FedProto's nearest prototype).

Client models (``client_model``, FedBN): a client's model is the shared one with a part the
client keeps in its state, ``client_model(shared, client_state)``. Training starts from it with
``shared`` the payload; evaluation scores it with ``shared`` the server state, per client, as
for personal models (a client never sampled has its initial state).

Two models a client (``train_params``, Ditto, APFL, FedRoD): where a client trains more than
the model it is scored with (Ditto's global model and its personal one, side by side), the
tree it trains is ``train_params(payload, client_state)``, one dict of tensors: the shared
model under its own names and the client's part under names no module has (``@ditto/fc.weight``).
``local_loss`` sums the models' losses, so one step on the tree is their simultaneous steps;
``client_result`` uploads the shared part and keeps the rest. ``client_model`` stays what is
scored; training starts from ``train_params`` instead. Not with a BatchNorm model's running
statistics under the extra names (the step threads one set of them).

The loss alone (``objective``, None: ``local_loss``): where ``local_loss`` also carries part
of the update rule (FedADC's Nesterov variant takes its gradient at a shifted point), this
is the loss without it. Personalisation (``eval.personalize_loss: algorithm``) fine-tunes the
classifier with it and the train section's optimiser: no ``grad_correction``, no
``optimizer`` of the algorithm's own.

Calibration at evaluation (``calibration``, CCVR): after the round's aggregation, at its
evaluation, each client of the evaluation panel runs the global model's feature extractor
over its training data and uploads ``calibration.stats`` of the features; the server folds
them with ``calibration.merge`` and ``calibration.calibrate`` makes a calibrated model from
them, evaluated beside the global one (``calibrated_accuracy``). It never goes down to the
clients: training is the algorithm's own, whatever the calibration does.

Randomness inside training (FedGen's generator noise): an algorithm with ``noise_dim``
finds ``batch["noise"]``, standard normal of shape (batch rows, noise_dim), a pure function
of (seed, round, client, step), the same rows under every executor.

Rules for ``local_loss``, ``grad_correction``, the optimiser and ``client_result`` (they run
under ``vmap`` in the batched executor): tensors in, tensors out; no ``.item()``, no Python
branches on tensor values, no in-place edits of inputs, no randomness (the engine passes
any noise in). ``batch["w"]`` is the per-sample weight (1/len for real samples, 0 for
padding), so losses are weighted sums. A missing optional hook means FedAvg's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

import torch

from fedrift.functional.optim import Transform
from fedrift.errors import ConfigError, FedriftError
from fedrift.functional.tree import weighted_sum
from fedrift.params import params

Params = dict[str, torch.Tensor]
Tree = dict[str, Any]
Apply = Callable[..., Any]  # apply(params, x, mode="logits")


@params
class AlgorithmParams:
    """Options every algorithm has.

    aggregation: weights of client results, ``samples`` (p_k = n_k / sum n_j, the default for
    every method) or ``uniform`` (a plain mean, as SlowMo's and FedADC's papers write).
    """

    aggregation: Literal["samples", "uniform"] = "samples"


@dataclass(frozen=True)
class Setup:
    """What an algorithm may know about the run when it is built."""

    num_classes: int
    num_clients: int
    feature_dim: int
    lr: float
    momentum: float
    weight_decay: float
    clip_grad_norm: float | None
    seed: int
    projection_dim: int | None = None  # the model's projection head width (MOON, FedGKD+), None: no head
    batch_size: int = 32  # train.batch_size
    apply: Apply | None = None  # the model, called functionally: for server-side training (FedGen, FedDF)
    holdout_x: torch.Tensor | None = None  # training samples the server holds (partition.holdout), never a client's
    holdout_y: torch.Tensor | None = None


class HookReturnError(FedriftError):
    """A hook returned another form than the engine's contract (the message says which)."""


LOCAL_LOSS_FORM = "(loss, aux): loss a one-element tensor, aux a dict of str -> tensor, e.g. (ce, {}) or (ce + kd, {'kd': kd})"


def check_local_loss(name: str, out: Any) -> None:
    """Refuse a ``local_loss`` return that is not ``(loss, aux)`` as the engine needs it: one
    check, at the first step, with the same message under every executor."""
    if not (isinstance(out, tuple) and len(out) == 2):
        got = f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise HookReturnError(f"algorithm {name}: hook local_loss returned {got}; expected {LOCAL_LOSS_FORM}")
    loss, aux = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}"
        raise HookReturnError(f"algorithm {name}: hook local_loss returned {got} as loss; expected {LOCAL_LOSS_FORM}")
    if not isinstance(aux, dict):
        raise HookReturnError(f"algorithm {name}: hook local_loss returned a {type(aux).__name__} as aux; expected {LOCAL_LOSS_FORM}")
    for k, v in aux.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise HookReturnError(f"algorithm {name}: hook local_loss returned aux[{k!r}], a {type(v).__name__}; "
                                  f"expected {LOCAL_LOSS_FORM}")


def term_off(value: Any, off: float = 0.0) -> bool:
    """Whether an option is at the value that leaves its method's term out (where the method is
    FedAvg exactly, built without the term). A tensor is never: it is a stacked run's value
    (``engine.step_values``), and runs share a step only when their algorithms have the same
    hooks, so the run it belongs to has the term."""
    return not isinstance(value, torch.Tensor) and value == off


def require_projection(name: str, setup: Setup) -> None:
    """Refuse, before anything is written, a model without the projection head ``name`` needs."""
    if setup.projection_dim is None:
        raise ConfigError(
            f"model.projection_dim: algorithm {name} needs a model with a projection head and this model has "
            "none; add model.projection_dim=256 (MOON's paper and FedGKD's released code) on cnn, mlp, resnet8 or resnet18"
        )


@dataclass(frozen=True)
class RoundInfo:
    round: int  # 1-based
    num_clients: int  # N, the whole federation
    sampled: tuple[int, ...]  # S_t, ascending


@dataclass(frozen=True)
class ClientData:
    """A client's samples, and the teacher hook's outputs on them when the algorithm has one."""

    x: torch.Tensor
    y: torch.Tensor
    teacher: dict[str, Any] | None = None


def default_init_server(global_params: Params) -> Tree:
    return {"params": global_params}


def default_broadcast(state: Tree, info: RoundInfo) -> Tree:
    return {"params": state["params"]}


def default_client_result(payload: Tree, end_params: Params, ctx: Tree) -> tuple[Tree, Tree]:
    return {"params": end_params}, ctx.get("state", {})


def fedavg_aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
    """``w_{t+1} = sum_k p_k w_k``."""
    return {**state, "params": weighted_sum(uploads["params"], weights)}


def fedavg_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
    """FedAvg as a streamed aggregate: the new model is the p-weighted sum itself."""
    return {**state, "params": sums["params"]}


SumWeights = Literal["weights", "uniform"]
FEDAVG_SUMS: dict[str, SumWeights] = {"params": "weights"}


def sum_weights(kind: SumWeights, weights: torch.Tensor) -> torch.Tensor:
    """The coefficients of one streamed sum: the round's p_k, or 1/K for each of K uploads."""
    return weights if kind == "weights" else torch.full_like(weights, 1.0 / len(weights))


def upload_sums(stacked: Tree, weights: torch.Tensor, sums: dict[str, SumWeights]) -> Tree:
    """The sums an ``aggregate_sums`` reads, from a whole round's stacked uploads."""
    return {field: weighted_sum(stacked[field], sum_weights(kind, weights)) for field, kind in sums.items()}


def _from_sums(sums: dict[str, SumWeights], aggregate_sums: Callable[[Tree, Tree, RoundInfo], Tree]):
    def aggregate(state: Tree, uploads: Tree, weights: torch.Tensor, info: RoundInfo) -> Tree:
        return aggregate_sums(state, upload_sums(uploads, weights, sums), info)

    aggregate.from_sums = aggregate_sums  # type: ignore[attr-defined]  # dataclasses.replace keeps it
    return aggregate


@dataclass(frozen=True)
class Calibration:
    """A post-hoc calibration of the global model, run by the server at evaluation (module
    docstring). ``stats(h, y)``: one client's upload from its features ``h`` (rows: its
    training samples, the global model's ``mode="features"``) and labels ``y``; ``merge(acc,
    stats)``: the server's running fold (``acc`` None for the first client); ``calibrate(params,
    acc, round, apply, head)``: the calibrated model, equal to ``params`` outside the
    parameter names in ``head`` (the classifier). When: ``at`` None, at every evaluated
    round; ``at`` a tuple of rounds, at those rounds (evaluated there whatever ``eval.every``
    says) and the last; ``()``: the last only."""

    stats: Callable[[torch.Tensor, torch.Tensor], Tree]
    merge: Callable[[Tree | None, Tree], Tree]
    calibrate: Callable[[Params, Tree, int, Apply, set[str]], Params]
    at: tuple[int, ...] | None = None

    def due(self, t: int, last: int) -> bool:
        """Whether evaluated round ``t`` of ``last`` calibrates (the last always does: a
        calibrated model is the run's output)."""
        return t == last or self.at is None or t in self.at


@dataclass(frozen=True)
class Algorithm:
    """An FL algorithm as data: its hyper-parameters and its hooks (see module docstring)."""

    name: str
    hparams: Any
    local_loss: Callable[[Params, Tree, Tree, Tree, Apply], tuple[torch.Tensor, Tree]]
    objective: Callable[[Params, Tree, Tree, Tree, Apply], tuple[torch.Tensor, Tree]] | None = None  # the loss alone (docstring)
    init_server: Callable[[Params], Tree] = default_init_server
    broadcast: Callable[[Tree, RoundInfo], Tree] = default_broadcast
    init_client: Callable[[Params], Tree] | None = None
    client_summary: Callable[[Tree, Tree, ClientData, Apply], Tree] | None = None
    pre_combine: Callable[[Tree, Tree, torch.Tensor], Tree] | None = None
    client_start: Callable[[Tree, Tree, ClientData, Apply], Tree] | None = None
    teacher: Callable[[Tree, torch.Tensor, Apply], Tree] | None = None  # per-sample, cacheable
    grad_correction: Callable[[Params, Params, Tree, Tree], Params] | None = None
    optimizer: Transform | None = None  # None: the train section's (train.optimizer)
    # (its optimiser's fresh state, the client's context) -> the state the client's training
    # starts from: what of the client the optimiser needs (FedRep: its head phase's length)
    optimizer_start: Callable[[Any, Tree], Any] | None = None
    local_sgd: bool = False  # its math assumes the train section's local SGD (refuses train.optimizer=adamw)
    client_end: Callable[[Tree, Params, Tree, ClientData, Apply], Tree] | None = None
    client_result: Callable[[Tree, Params, Tree], tuple[Tree, Tree]] = default_client_result
    aggregate: Callable[[Tree, Tree, torch.Tensor, RoundInfo], Tree] = fedavg_aggregate
    noise_dim: int | None = None  # batch["noise"]: (rows, noise_dim) standard normal, per step
    personal: bool = False  # clients train and keep their own model, state["params"]
    client_model: Callable[[Tree, Tree], Params] | None = None  # (shared, client state) -> its model (docstring)
    train_params: Callable[[Tree, Tree], Params] | None = None  # (payload, client state) -> the tree it trains (docstring)
    predict: Callable[[Tree, Params, torch.Tensor, Apply], dict[str, torch.Tensor]] | None = None
    calibration: Calibration | None = None  # post-hoc calibration at evaluation (CCVR; module docstring)
    sums: dict[str, SumWeights] | None = None  # streamed aggregation (module docstring): field -> weighting
    aggregate_sums: Callable[[Tree, Tree, RoundInfo], Tree] | None = None
    # set by engine.build: this algorithm built again by its factory at other values
    # ({"train.lr": ..., option: ...}, the options among ``value_keys``, its tune space): a
    # train.lr_schedule's rounds at their lr (hooks read the lr they were built with), and, as
    # tensors, stacked runs that differ only in those (engine.step_values: a tune's trials)
    at_values: Callable[[Mapping[str, Any]], "Algorithm"] | None = None
    value_keys: tuple[str, ...] = ()
    # rounds in which this method trains exactly as FedAvg (FedGKD: round 1, its buffer empty):
    # fedrift select judges it only once it has had as many rounds of its own as the others
    same_as_fedavg_until: int = 0

    def __post_init__(self) -> None:
        derived = getattr(self.aggregate, "from_sums", None)
        if self.aggregate is fedavg_aggregate and self.aggregate_sums is None:
            object.__setattr__(self, "sums", FEDAVG_SUMS)
            object.__setattr__(self, "aggregate_sums", fedavg_sums)
        if (self.sums is None) != (self.aggregate_sums is None):
            raise ValueError(f"algorithm {self.name}: sums and aggregate_sums make one streamed aggregate; give both or neither")
        if self.aggregate_sums is not None and derived is not self.aggregate_sums:
            if self.aggregate is not fedavg_aggregate:
                raise ValueError(f"algorithm {self.name}: give aggregate or aggregate_sums, not both")
            object.__setattr__(self, "aggregate", _from_sums(dict(self.sums), self.aggregate_sums))
        if (self.client_summary is None) != (self.pre_combine is None):
            raise ValueError(f"algorithm {self.name}: client_summary and pre_combine make one pre-phase; give both or neither")
        if self.personal and self.init_client is None:
            raise ValueError(f"algorithm {self.name}: personal models live in the client state; give init_client")
        if self.client_model is not None and (self.personal or self.init_client is None):
            raise ValueError(f"algorithm {self.name}: a client model joins the shared model and the client state; "
                             "give init_client, and not personal")
        if self.optimizer_start is not None and self.optimizer is None:
            raise ValueError(f"algorithm {self.name}: optimizer_start prepares the algorithm's own optimiser's state; "
                             "give optimizer too")
        if self.train_params is not None and self.client_model is None:
            raise ValueError(f"algorithm {self.name}: train_params is the tree a client model trains; give client_model too")
