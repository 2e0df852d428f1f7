"""Choosing an executor: the registry ``EXECUTORS`` of the names ``engine.executor`` may take,
and :func:`choose_executor`, what ``engine.executor: auto`` runs.

Below the run builder (``engine.build`` checks ``engine.executor`` against the registry) and
the executors, which the registry's entries make: the built-in ones are registered by
``fedrift.engine.executors``, which ``import fedrift`` loads (through ``fedrift.api``), and a
plugin registers its own, so the builder never imports the executors that rebuild runs with it.
"""

from __future__ import annotations

from fedrift.registry import Registry

EXECUTORS: Registry = Registry("executor")


# samples a client must train on per round before a worker process pays for shipping its model
PROCESSES_MIN_SAMPLES = 256
# samples trained in the whole run (rounds x clients a round x samples a client) before the
# workers' start-up pays back: starting two workers (each loads the data and builds the run)
# cost about 4-5 s on this project's 2-core machine, the sequential training time of ~4,000
# FedAvg-CNN samples; with the training split over two workers that is earned back after
# about twice as many (a 4-round demo run, 4,000 samples: processes 7.2 s, sequential 4.8 s)
PROCESSES_MIN_RUN_SAMPLES = 10_000
# clients a round from which a GPU runs them vectorised (choose_executor says why): with the
# step captured as CUDA graphs (engine.cuda_graphs), and launched op by op
GPU_BATCHED_MIN_COHORT, GPU_UNCAPTURED_MIN_COHORT = 2, 8


def choose_executor(
    device: str, cohort: int, num_params: int, has_conv: bool, cpus: int, samples_per_client: float = float("inf"),
    rounds: int | None = None, states_on_disk: bool = False, graphs: bool = True,
) -> str:
    """What ``engine.executor: auto`` runs (BENCHMARKS.md has the measurements behind it).

    - On a GPU, with the vectorised step captured as CUDA graphs (``graphs``,
      ``engine.cuda_graphs``, the default): ``batched`` from 2 clients a round, where one
      launch a step replaces the host's hundreds (R1 at paper settings on an H200, 4 clients
      of ResNet-8: 3.57x the samples a second of ``sequential``, BENCHMARKS.md G); one client
      has nothing to vectorise. Launched op by op: ``batched`` from 8 clients a round (R2, 20
      clients of FedADC's CNN: 1.15x faster than ``sequential``), ``sequential`` with fewer
      (R1's 4 clients: sequential 1.4-1.7x faster; 8, between the two, is the CPU rule's).
    - On CPUs, compute-bound models (convolutions, or over a million parameters): each
      client's step already saturates a core, so ``processes`` (one thread per worker) uses
      the cores better than threads inside one process do, when each client trains on
      enough samples a round (``samples_per_client``, at least 256) to pay for sending its
      model both ways, and the run trains on enough samples in all (``rounds`` x ``cohort``
      x ``samples_per_client``, at least 10,000) to pay for starting the workers;
      ``sequential`` otherwise (measured on S2, 8 samples a client of the FedAvg CNN:
      processes 2.7x slower than sequential; 4 rounds of the demo: 7.2 s against 4.8 s) and
      on one CPU.
    - On CPUs, small models with many clients a round: per-step overhead dominates and
      ``batched`` amortises it over up to 256 clients at once; unless the client states are
      kept on disk (``states_on_disk``, ``engine.client_state: disk``), a sign that memory
      is short: a vectorised group holds its clients' states and about a dozen model-sized
      tensors each, where ``sequential`` holds one client's (S4: 1,332 MB against 899 MB).
    - Otherwise ``sequential``.
    """
    if device.startswith("cuda"):
        return "batched" if cohort >= (GPU_BATCHED_MIN_COHORT if graphs else GPU_UNCAPTURED_MIN_COHORT) else "sequential"
    if has_conv or num_params > 1_000_000:
        run_samples = (rounds if rounds is not None else float("inf")) * cohort * samples_per_client
        worth = (cpus > 1 and cohort > 1 and samples_per_client >= PROCESSES_MIN_SAMPLES
                 and run_samples >= PROCESSES_MIN_RUN_SAMPLES)
        return "processes" if worth else "sequential"
    return "batched" if cohort >= 8 and not states_on_disk else "sequential"
