"""The sequential executor's in-place step touches only the client's own copy of the model:
the broadcast model and a personal model held in the client-state store stay as they were."""

from __future__ import annotations

import torch

from fedrift.algorithms.base import RoundInfo
from fedrift.api import build_run, prepare
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.local import make_tools


def _round(tiny, name: str):
    prep = prepare(tiny(algorithm={"name": name}))
    model, alg = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    tools = make_tools(model, alg, prep.config.train, fed.x, fed.y, 0)
    assert tools.optimizer.apply_inplace is not None  # the in-place path is the one tested
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    server = alg.init_server(params)
    payload = alg.broadcast(server, RoundInfo(round=1, num_clients=fed.num_clients, sampled=(0, 1)))
    states = [alg.init_client(params) if alg.init_client else {} for _ in range(2)]
    jobs = [client_job(fed, k, states[k], prep.config.train, 0, 1) for k in range(2)]
    before = (_copy(payload), [_copy(s) for s in states])
    return before, (payload, states), SequentialExecutor().run_round(tools, payload, jobs, 1)


def _copy(tree):
    return {k: _copy(v) if isinstance(v, dict) else v.clone() if isinstance(v, torch.Tensor) else v for k, v in tree.items()}


def _identical(a, b):
    return all(_identical(a[k], b[k]) if isinstance(a[k], dict) else torch.equal(a[k], b[k]) for k in a
               if isinstance(a[k], (dict, torch.Tensor)))


def test_the_broadcast_model_is_not_trained_in_place(tiny):
    (payload0, _), (payload, _), outs = _round(tiny, "fedavg")
    assert _identical(payload["params"], payload0["params"])
    assert not _identical(outs[0].end_params, payload0["params"])  # while the client did train


def test_a_personal_model_in_the_store_is_not_trained_in_place(tiny):
    (_, states0), (_, states), outs = _round(tiny, "fedproto")
    assert _identical(states[0], states0[0]) and _identical(states[1], states0[1])
    assert not _identical(outs[0].end_params, states0[0]["params"])
