"""The speed benchmark's Flower baseline: the same FedAvg run as ``speed.usual_case`` (same
data, partition, model and hyper-parameters, all built by fedrift) on Flower's simulation
engine (``flwr[simulation]``, the ``bench`` extra), start-up included.

Flower's Message API: a ``ServerApp`` whose main runs ``flwr.serverapp.strategy.FedAvg`` and a
``ClientApp`` whose train function runs the usual local loop (``torch.optim.SGD``, a shuffled
``DataLoader``) on client ``partition-id``, launched by ``flwr.simulation.run_simulation`` on a
local Ray cluster with one CPU per actor (as many actors as cores run at once). Flower samples
the clients itself (``random.sample`` over node ids that are random per run), so the cohorts
differ from fedrift's and between runs; the global model is evaluated on fedrift's test set
after the last round only (the usual loop evaluates every round, outside its timed round).

Nothing reaches the network: Flower's telemetry and Ray's usage stats are off, Ray binds to
the loopback address and starts no dashboard.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import threading
import time
from typing import Any

# Read at import time by flwr and at ray.init by Ray: set them before either is imported.
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences a FutureWarning; no GPU here

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

CFG_KEY = "fedrift-config"  # the ConfigRecord entry that carries the fedrift config (JSON)

# Per process: the prepared data and a model instance, built on a process's first ClientApp
# call (one Ray actor serves many clients) and on the server's first use.
_CACHE: dict[str, Any] = {}
# The running simulation's bookkeeping, shared by flower_case and the ServerApp thread.
_RUN: dict[str, Any] = {}


def _setup(cfg_json: str, threads: int | None, prep: Any = None) -> dict[str, Any]:
    if _CACHE.get("key") != cfg_json:
        import torch

        from fedrift.api import prepare
        from fedrift.models import build_model

        if threads:
            torch.set_num_threads(threads)
        prep = prep if prep is not None else prepare(json.loads(cfg_json))
        c, ds = prep.config, prep.dataset
        model = build_model(c.model.name, prep.options["model"], ds.input_shape, ds.num_classes, c.seed)
        _CACHE.clear()
        _CACHE.update(key=cfg_json, prep=prep, model=model)
    return _CACHE


# ---------------------------------------------------------------------------------- client


client_app = ClientApp()


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    t_start = time.time()
    import torch

    st = _setup(str(msg.content["config"][CFG_KEY]), threads=1)  # one CPU per actor
    prep, model = st["prep"], st["model"]
    ds, part, tc = prep.dataset, prep.partition, prep.config.train
    k = int(context.node_config["partition-id"])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.train()
    ix = torch.as_tensor(part.train[k])
    from speed import usual_local_training  # the same local loop as the usual-loop baseline

    usual_local_training(model, ds.x_train[ix], ds.y_train[ix], tc)
    metrics = MetricRecord({"num-examples": len(ix), "t-start": t_start, "t-end": time.time()})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


# ---------------------------------------------------------------------------------- server


server_app = ServerApp()


def _train_metrics(records: list[RecordDict], weight_key: str) -> MetricRecord:
    """Keeps each round's client timestamps (for start-up and the first client's start)."""
    starts = [float(r["metrics"]["t-start"]) for r in records]
    ends = [float(r["metrics"]["t-end"]) for r in records]
    _RUN["client_spans"].append((min(starts), max(ends), len(records)))
    return MetricRecord({weight_key: sum(int(r["metrics"][weight_key]) for r in records)})


def _evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
    """Called by the strategy before round 1 (round 0) and after every round: the round marks.
    Evaluates the global model on the test set after the last round only."""
    _RUN["marks"].append(time.time())
    if server_round < _RUN["rounds"]:
        return None
    import torch

    st = _setup(_RUN["cfg_json"], threads=None)
    model, ds = st["model"], st["prep"].dataset
    model.load_state_dict(arrays.to_torch_state_dict())
    model.eval()
    with torch.no_grad():
        acc = (model(ds.x_test).argmax(1) == ds.y_test).float().mean().item()
    _RUN["accuracy"] = acc
    return MetricRecord({"accuracy": acc})


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    from fedrift.engine.sampling import cohort_size

    st = _setup(_RUN["cfg_json"], threads=None)
    prep, model = st["prep"], st["model"]
    c, n = prep.config, prep.partition.num_clients
    m = cohort_size(n, c.train.clients_per_round, c.train.participation)
    random.seed(c.seed)  # Flower samples with the global `random`
    # int(n * m / n) may round down to m - 1; min_train_nodes lifts it back to exactly m.
    strategy = FedAvg(fraction_train=m / n, fraction_evaluate=0.0, min_train_nodes=m, min_evaluate_nodes=0,
                      min_available_nodes=n, train_metrics_aggr_fn=_train_metrics)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=c.train.rounds,
                   train_config=ConfigRecord({CFG_KEY: _RUN["cfg_json"]}), evaluate_fn=_evaluate)


# ---------------------------------------------------------------------------------- memory


class _RaySampler(threading.Thread):
    """Samples the summed RSS of this process's descendants (Ray's GCS, raylet, workers and
    the ClientApp actors) every `every` seconds, from /proc (Linux; psutil is not installed:
    Ray only vendors it). A sum of RSS counts shared pages (libraries, Ray's object store)
    once per process, so it over-states what the machine pays."""

    def __init__(self, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.every, self.stop = every, threading.Event()
        self.peak_total = self.peak_actors = 0.0
        self.max_actors = 0
        self.page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20

    def _sample(self) -> None:
        parent: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat", "rb") as f:
                        parent[int(d)] = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        children: dict[int, list[int]] = {}
        for pid, ppid in parent.items():
            children.setdefault(ppid, []).append(pid)
        todo, total, actors, count = list(children.get(os.getpid(), [])), 0.0, 0.0, 0
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, []))
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    rss = int(f.read().split()[1]) * self.page_mb
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read(200)
            except (OSError, IndexError, ValueError):
                continue
            total += rss
            if b"ClientAppActor" in cmd:
                actors += rss
                count += 1
        self.peak_total = max(self.peak_total, total)
        self.peak_actors = max(self.peak_actors, actors)
        self.max_actors = max(self.max_actors, count)

    def run(self) -> None:
        if not os.path.isdir("/proc"):
            self.peak_total = self.peak_actors = float("nan")
            return
        while not self.stop.is_set():
            self._sample()
            self.stop.wait(self.every)


# ---------------------------------------------------------------------------------- case


def flower_case(cfg: dict[str, Any], cores: int | None = None, verbose: bool = False) -> dict[str, Any]:
    """One FedAvg run of `cfg` on Flower's simulation engine (FedAvg whatever cfg's algorithm,
    like speed.usual_case); the keys of speed.usual_case plus Flower's start-up and the Ray
    processes' memory.

    s_per_round: median of rounds 2.. (strategy round marks, server side); first_round_s: round
    1, which overlaps Ray's start-up (the ServerApp thread starts before the Ray backend);
    startup_s: from before run_simulation until the first ClientApp call of round 1 begins;
    end_to_end_s: from before run_simulation until it returns (Ray shut down)."""
    from fedrift.api import prepare

    prep = prepare(cfg)
    cfg_json = prep.config.model_dump_json()  # fully resolved, so every process sees the same
    cores = cores or len(os.sched_getaffinity(0))
    _RUN.clear()
    _RUN.update(cfg_json=cfg_json, rounds=prep.config.train.rounds, marks=[], client_spans=[], accuracy=float("nan"))
    _CACHE.clear()
    _setup(cfg_json, threads=None, prep=prep)  # the server's data and initial model, as usual_case's
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": cores, "num_gpus": 0, "include_dashboard": False, "logging_level": "ERROR",
                      "log_to_driver": verbose, "_node_ip_address": "127.0.0.1"},
    }
    sampler = _RaySampler()
    sampler.start()
    t0_wall, t0 = time.time(), time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=prep.partition.num_clients,
                   backend_config=backend_config)
    end_to_end = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    marks, spans = _RUN["marks"], _RUN["client_spans"]
    if len(marks) != _RUN["rounds"] + 1:
        raise RuntimeError(f"Flower ran {len(marks) - 1} of {_RUN['rounds']} rounds")
    secs = [b - a for a, b in zip(marks, marks[1:])]
    return {
        "s_per_round": statistics.median(secs[1:]) if len(secs) > 1 else secs[0],
        "first_round_s": secs[0],
        "end_to_end_s": end_to_end,
        "startup_s": spans[0][0] - t0_wall,
        "strategy_start_s": marks[0] - t0_wall,
        "final_accuracy": _RUN["accuracy"],
        "peak_mb": _own_peak_mb(),
        "ray_peak_rss_mb": sampler.peak_total,
        "ray_actors_peak_rss_mb": sampler.peak_actors,
        "ray_actors": sampler.max_actors,
        "clients_per_round": spans[0][2],
    }


def _own_peak_mb() -> float:
    from fresh import peak_mb  # one definition: VmHWM, not the inherited ru_maxrss

    return peak_mb()
