"""The round split in two: driving ``engine.server.Server`` by hand with the client function
``engine.client.train_client`` (as a deployment does, the client states kept on the client's
side) gives the in-process engine's run bit for bit, pre-phases and client state included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedrift
from agreement import BITS, agree
from fedrift.engine.build import build_run, client_tools, prepare
from fedrift.engine.client import client_summary, train_client
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.outputs import RunWriter
from fedrift.engine.server import Server
from fedrift.engine.teacher import with_teacher


def _by_hand(cfg: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The run with the server half here and every client's state held 'on its device'."""
    prep = prepare(cfg)
    model, algorithm = build_run(prep)
    fed = Federation(prep.dataset, prep.partition, prep.device)
    writer = RunWriter(Path(prep.config.output.dir), overwrite=False)
    server = Server(prep.config, fed, model, algorithm, writer, clients_build_teacher=True, prephase_on_clients=True)
    tools = client_tools(prep)  # the clients' own tools, as a device builds them from the config
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    device_states: dict[int, dict] = {}
    try:
        for t in server.rounds():
            rnd = server.open(t)
            jobs = []
            for job in rnd.jobs:  # the device builds its own job, with the state it keeps
                k = job.client_id
                state = device_states.get(k) or (algorithm.init_client(initial) if algorithm.init_client else {})
                jobs.append(client_job(fed, k, state, prep.config.train, prep.config.seed, t))
            if rnd.needs_summaries:
                server.combine(rnd, [client_summary(tools, rnd.payload, j) for j in jobs])
            outputs = []
            for job in jobs:  # a device's teacher rows: its own samples' (engine.teacher_cache)
                own = with_teacher(tools, rnd.payload, [job], prep.config.engine.teacher_cache)
                out = train_client(own, rnd.payload, job, t)
                device_states[job.client_id] = out.state
                out.state = None  # stays on the device
                outputs.append(out)
            server.close(rnd, outputs, [])
    finally:
        server.release()
        writer.close()
        writer.release()
    return server.result().global_params, server.out.history


@pytest.mark.agreement
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fedcsd", "fedgkd"])
def test_server_and_client_halves_equal_the_engine(tiny, tmp_path, name):
    cfg = tiny(algorithm={"name": name}, train={"rounds": 3, "clients_per_round": 3},
               engine={"executor": "sequential", "threads": 1})
    ref = fedrift.run(cfg)
    cfg["output"]["dir"] = str(tmp_path / "by_hand")
    params, history = _by_hand(cfg)
    agree({k: v.cpu() for k, v in params.items()}, {k: ref.global_state[k] for k in params}, BITS)
    agree([r["test_accuracy"] for r in history], [r["test_accuracy"] for r in ref.history], BITS)
