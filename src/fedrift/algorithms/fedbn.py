"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID
Features via Local Batch Normalization"): FedAvg in which every BatchNorm layer stays local.

Algorithm 1 (Sec. 3): each client trains its whole model locally; at communication, every
layer that is not BatchNorm is averaged over the clients and copied back to them, and each
BatchNorm layer (its weight and bias, and its running mean and variance) stays the client's
own. With fedrift's model state (``models/norm.py``: the parameters, then every BatchNorm
layer's running statistics) and ``b`` its BatchNorm entries::

    client k starts from  (w_t without b) with b_k         (client_model)
    w_{t+1} = sum_k p_k w_k   over the entries not in b    (FedAvg's streamed sum)
    b_k     <- b_k at the end of the client's local steps  (client state)

It needs a model with BatchNorm (``model.norm: batch``, on ``cnn``, ``resnet8``, ``resnet18``
and ``resnet50``; refused otherwise in one line). Workload D (``examples/workload_d.yaml``,
the paper's digits-domains setting) runs it on ``model.norm=batch``: the FedAvg CNN with
BatchNorm after both convolutions, close to the paper's own digits model (a 3-conv CNN with
BatchNorm after every layer, its fully connected ones included: ``models/cnn.py`` says why
not those). ResNet-8 learns too slowly there (about 20% after 8 one-epoch rounds, with
GroupNorm or BatchNorm) to tell the two apart.

Decisions.

- A client never sampled holds the initial model's BatchNorm (``init_client`` of the initial
  model state: weight 1, bias 0, running mean 0, running variance 1 for a fresh
  ``BatchNorm2d``), which the server never updates: the authors' code (med-air/FedBN,
  ``federated/fed_digits.py``) starts every client as a copy of the server model and its
  ``communication`` never writes the server model's ``bn`` entries, so the server's are the
  initial ones throughout; with every client in every round (theirs) no client uses them
  after round 1, with partial participation a client uses them at its first round.
- The aggregation weights are fedrift's ``p_k = n_k / sum n_j`` as for every method;
  ``aggregation: uniform`` gives the paper's and the code's ``1/K`` (their clients have equal
  sizes, where the two agree).
- Evaluation: FedBN has no single global model. Each client's model (the shared weights
  with its own BatchNorm, as the authors test ``models[k]`` after ``communication``) is
  scored per client, as personal models are (``Algorithm.client_model``, engine/server.py):
  ``local_accuracy``, the mean over clients of their model on their own test split (the
  paper's number: each client on its own domain), is the headline, and
  ``val_local_accuracy`` what ``fedrift tune`` scores; ``test_accuracy`` is the mean over
  clients of their model on the whole test set (every domain, most of them not the client's
  own). The server's model (``final_model.pt``, ``result.global_state``) is the averaged
  shared weights with the initial BatchNorm: the model a client never sampled would hold,
  not one any trained client uses.
- Bytes: BatchNorm entries never leave the client, so neither the broadcast (``bytes_down``)
  nor the uploads (``bytes_up``) carry them.
- Not with ``eval.drift`` or ``eval.personalize`` (no one global model), nor in a Flower
  deployment (each client's BatchNorm stays on its device, so the server could score no
  client's model): refused in one line.
"""

from __future__ import annotations

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Params, RoundInfo, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.tree import detach_clone
from fedrift.errors import ConfigError

BN_ENTRIES = ("weight", "bias", "running_mean", "running_var")  # a BatchNorm layer's entries in the model state


def local_keys(state: Params) -> frozenset[str]:
    """The BatchNorm entries of a model state: each layer with running statistics (the
    BatchNorm layers, ``models/norm.py``) gives its weight, bias and statistics."""
    layers = [k[: -len(".running_mean")] for k in state if k.endswith(".running_mean")]
    return frozenset(key for layer in layers for e in BN_ENTRIES if (key := f"{layer}.{e}") in state)


def split(state: Params) -> tuple[Params, Params]:
    """``(shared, local)``: the entries every client averages, and the BatchNorm ones it keeps."""
    own = local_keys(state)
    return {k: v for k, v in state.items() if k not in own}, {k: v for k, v in state.items() if k in own}


def _refuse_without_batchnorm() -> ConfigError:
    return ConfigError("model.norm: fedbn keeps each client's BatchNorm layers on the client and this model has "
                       "none; allowed: batch (model.norm=batch with cnn, resnet8, resnet18 or resnet50)")


@ALGORITHMS.register(
    "fedbn", "FedBN: FedAvg with every BatchNorm layer (weights and statistics) kept by each client; model.norm batch",
    AlgorithmParams, space={},
)
def fedbn(hp: AlgorithmParams, setup: Setup) -> Algorithm:
    if setup.apply is not None and not getattr(setup.apply, "stat_keys", ()):
        raise _refuse_without_batchnorm()  # refused as the run is built, before anything is written

    def init_server(global_params: Params) -> Tree:
        if not local_keys(global_params):
            raise _refuse_without_batchnorm()
        return {"params": global_params}

    def broadcast(state: Tree, info: RoundInfo) -> Tree:
        return {"params": split(state["params"])[0]}

    def init_client(global_params: Params) -> Tree:
        return {"bn": detach_clone(split(global_params)[1])}

    def client_model(shared: Tree, client_state: Tree) -> Params:
        """The shared entries (the payload's, or the server's whole model whose BatchNorm the
        client's replaces) with the client's own BatchNorm."""
        return {**shared["params"], **client_state["bn"]}

    def client_result(payload: Tree, end_params: Params, ctx: Tree) -> tuple[Tree, Tree]:
        shared, own = split(end_params)
        return {"params": shared}, {"bn": own}

    def aggregate_sums(state: Tree, sums: Tree, info: RoundInfo) -> Tree:
        """FedAvg's p-weighted sum over the shared entries; the server's BatchNorm stays."""
        return {**state, "params": {**state["params"], **sums["params"]}}

    return Algorithm(
        name="fedbn", hparams=hp, local_loss=ce_loss, init_server=init_server, broadcast=broadcast,
        init_client=init_client, client_model=client_model, client_result=client_result,
        sums={"params": "weights"}, aggregate_sums=aggregate_sums,
    )
