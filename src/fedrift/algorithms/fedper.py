"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary 2019): the top layers stay on each client.

Clients train the whole model; only the base layers are averaged, and the personalisation
layers (the top ``personal_layers``, the classifier by default) are each client's own. It is
FedBN's mechanism (``Algorithm.client_model``) with another split, which this module also
gives LG-FedAvg and FedRep: the split helpers below. ``personal_layers: 0`` is FedAvg. Maths,
defaults and departures: docs/reference/algorithms/personalisation.md.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Callable

from pydantic import Field

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.errors import ConfigError
from fedrift.functional.tree import detach_clone
from fedrift.models.norm import running_stat_names
from fedrift.params import params


def module_of(key: str) -> str:
    """The module a state entry belongs to: its name up to the last dot (``fc.weight`` -> ``fc``)."""
    return key.rsplit(".", 1)[0]


@lru_cache(maxsize=64)
def _layers(signature: tuple[tuple[str, int], ...]) -> tuple[tuple[str, ...], ...]:
    modules: dict[str, list[tuple[str, int]]] = {}
    for key, dim in signature:
        modules.setdefault(module_of(key), []).append((key, dim))
    out: list[list[str]] = []
    for entries in modules.values():
        if not out or any(dim >= 2 for _, dim in entries):  # a linear, convolution or embedding starts a layer
            out.append([k for k, _ in entries])
        else:  # a normalisation (its weight, bias and statistics) joins the layer before it
            out[-1].extend(k for k, _ in entries)
    return tuple(tuple(layer) for layer in out)


def layers(state: Params) -> tuple[tuple[str, ...], ...]:
    """The model's layers, bottom first: one per module with a weight of two or more dimensions
    (linear, convolution, embedding), in the order the state first names its modules, each with
    the normalisation modules that follow it (weight, bias, running statistics). The order is the
    model's parameter order: ``fc`` (the classifier) is the top layer of every fedrift model."""
    return _layers(tuple((k, v.dim()) for k, v in state.items()))


def top_keys(state: Params, count: int) -> frozenset[str]:
    """The entries of the top ``count`` layers (all of them when the model has no more)."""
    found = layers(state)
    return frozenset(k for layer in found[max(len(found) - count, 0):] for k in layer)


def model_layers(setup: Setup) -> tuple[tuple[str, ...], ...] | None:
    """The run's model's layers (:func:`layers` of its state: the parameters, then the BatchNorm
    statistics) when the setup carries the model (a run's build), else None (an algorithm built
    alone: ``algorithms.make``). Read from names and shapes, nothing copied."""
    model = getattr(setup.apply, "model", None)
    if model is None:
        return None
    signature = [(k, v.dim()) for k, v in model.named_parameters()] + [(k, 1) for k in running_stat_names(model)]
    return _layers(tuple(signature))


def count_layers(setup: Setup) -> int | None:
    """How many layers (:func:`layers`) the run's model has; None without the model."""
    found = model_layers(setup)
    return None if found is None else len(found)


def kept_part(name: str, hp: Any, own_keys: Callable[[Params], frozenset[str]], check: Callable[[Params], None],
              **hooks: Any) -> Algorithm:
    """FedBN's mechanism for a split by layers: the entries ``own_keys`` names (of a state in the
    model's order) stay on each client, the rest is FedAvg. The client starts from the broadcast
    shared entries joined with its own part (``client_model``), uploads the shared entries only,
    and keeps its own part; the server averages the shared entries (FedAvg's streamed sum) and
    keeps its own initial copy of the rest, the part a client never sampled holds. ``check``
    refuses a split that shares nothing, as the server starts. ``hooks``: more of the
    algorithm's (FedRep's local phases)."""

    def init_server(global_params: Params) -> Tree:
        check(global_params)
        return {"params": global_params}

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        own = own_keys(state["params"])
        return {"params": {k: v for k, v in state["params"].items() if k not in own}}

    def init_client(global_params: Params) -> Tree:
        own = own_keys(global_params)
        return {"own": detach_clone({k: v for k, v in global_params.items() if k in own})}

    def client_model(shared: Tree, client_state: Tree) -> Params:
        """The shared entries (the broadcast, or the server's whole model whose own part the
        client's replaces) with the client's own part."""
        return {**shared["params"], **client_state["own"]}

    def client_result(payload: Tree, end_params: Params, ctx: Tree) -> tuple[Tree, Tree]:
        own = ctx["state"]["own"]
        return {"params": {k: v for k, v in end_params.items() if k not in own}}, {"own": {k: end_params[k] for k in own}}

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        """FedAvg's p-weighted sum over the shared entries; the server's copy of the rest stays."""
        return {**state, "params": {**state["params"], **sums["params"]}}

    return Algorithm(
        name=name, hparams=hp, local_loss=ce_loss, init_server=init_server, broadcast=broadcast,
        init_client=init_client, client_model=client_model, client_result=client_result,
        sums={"params": "weights"}, aggregate_sums=aggregate_sums, **hooks,
    )


def top_split(name: str, key: str, count: int, setup: Setup, low: int = 0) -> tuple[
        Callable[[Params], frozenset[str]], Callable[[Params], None]]:
    """The own part of FedPer, FedRep and FedBABU: the top ``count`` layers; and the check that
    refuses a split that leaves no layer below them (run at build when the setup carries the
    model, before anything is written, and as the server starts). ``low``: the option's least
    value, for the message."""

    def check(state: Params) -> None:
        refuse(len(layers(state)))

    def refuse(total: int) -> None:
        if count < total:
            return
        allowed = (f"{low} to {total - 1}" if total - 1 >= low else
                   "a model with layers below its classifier (mlp, cnn, resnet8, ...: not logreg, nor text with "
                   "freeze_encoder)")
        raise ConfigError(f"algorithm.{key}: {count} is every layer of this model ({total}), so {name} would "
                          f"have no shared body; allowed: {allowed}")

    total = count_layers(setup)
    if total is not None:
        refuse(total)
    return (lambda s: top_keys(s, count)), check


@params
class FedPerParams(AlgorithmParams):
    """personal_layers: how many top layers stay on each client (K_P, the paper's personalisation
    layers; 1: the classifier, as the FedRep and FedBABU authors run FedPer; 0: FedAvg)."""

    personal_layers: Annotated[int, Field(ge=0)] = 1


@ALGORITHMS.register(
    "fedper", "FedPer: FedAvg with the top layers (the classifier) kept by each client; scored per client",
    FedPerParams, space={},
)
def fedper(hp: FedPerParams, setup: Setup) -> Algorithm:
    if hp.personal_layers == 0:
        return Algorithm(name="fedper", hparams=hp, local_loss=ce_loss)  # nothing personal: FedAvg
    own, check = top_split("fedper", "personal_layers", hp.personal_layers, setup)
    return kept_part("fedper", hp, own, check)
