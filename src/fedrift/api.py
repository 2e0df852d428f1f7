"""The Python API: ``fedrift.run(config)``; also what the CLI calls."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from fedrift import yamlio
from fedrift.algorithms.base import Algorithm
from fedrift.config import Config, apply_overrides, read_yaml
from fedrift.data.fingerprint import dataset_fingerprint
from fedrift.engine.build import (  # noqa: F401 - the API's names for them (tools and tests use them)
    SECTION_REGISTRIES, Prepared, build_algorithm, build_run, cudnn_choice, final_state, prepare, resolve_device,
    resolve_options, resolved_yaml, run_facts, run_folder, shared_options,
)
from fedrift.engine.checkpoint import Checkpointer, CheckpointError, Snapshot, prefix_sha256
from fedrift.engine.executors import EXECUTORS, choose_executor
from fedrift.engine.executors.processes import available_cpus
from fedrift.engine.federation import Federation
from fedrift.engine.loop import run_federation
from fedrift.engine.outputs import CLIENTS, RunWriter
from fedrift.engine.sampling import cohort_size
from fedrift.engine.stacked_step import form_refusal
from fedrift.engine.tensorboard import Board
from fedrift.errors import ClusterLostError, ConfigError, DivergenceError, FedriftError, OutputError, describe_os_error, writing
from fedrift.models.base import FedModel
from fedrift.safe_files import LinkRefused


@dataclass
class RunResult:
    """What :func:`run` and :func:`resume` return: ``history``, one dict of metrics per evaluated
    round (as in ``metrics.jsonl``); ``summary``, the run's ``summary.json`` (final and best
    accuracy, ``status``, byte totals, ...); ``global_state``, the final global model's
    ``state_dict``; ``output_dir``, the run folder; ``config``, the resolved config; and
    ``server_state``, everything the server keeps between rounds."""

    history: list[dict[str, Any]]  # one dict per evaluated round
    summary: dict[str, Any]
    global_state: dict[str, torch.Tensor]  # the final global model's state_dict
    output_dir: Path
    config: Config
    server_state: dict[str, Any] = dataclasses.field(default_factory=dict)  # all the server keeps


def resolve_executor(cfg: Config, prep: Prepared, model: FedModel) -> str:
    """``engine.executor`` with ``auto`` replaced by the rule's choice for this run."""
    if cfg.engine.executor != "auto":
        return cfg.engine.executor
    tc = cfg.train
    cohort = cohort_size(prep.partition.num_clients, tc.clients_per_round, tc.participation)
    has_conv = any(isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)) for m in model.modules())
    num_params = sum(p.numel() for p in model.parameters())
    cpus = cfg.engine.workers or available_cpus()
    mean_size = float(prep.partition.sizes().mean()) if prep.partition.num_clients else 0.0
    samples = tc.local_steps * tc.batch_size if tc.local_steps else tc.local_epochs * mean_size
    return choose_executor(str(prep.device), cohort, num_params, has_conv, cpus, samples, tc.rounds,
                           states_on_disk=cfg.engine.client_state == "disk", graphs=cfg.engine.cuda_graphs)


def check_compile(cfg: Config, executor_name: str, model: FedModel) -> None:
    """``engine.compile`` refused where nothing would read it: an executor without the
    vectorised step (``auto`` resolved to one), or a step that does not go through the model's
    stacked form (``engine.stacked_step.form_refusal``)."""
    if executor_name not in ("batched", "stacked"):
        raise ConfigError(f"engine.compile: true is read by engine.executor batched and stacked only, and auto chose "
                          f"{executor_name} for this run; allowed: engine.executor=batched or stacked, or "
                          "engine.compile=false")
    why = form_refusal(model, cfg.privacy.level == "sample")
    if why is not None:
        raise ConfigError(f"engine.compile: {why}; allowed: engine.compile=false, or a model with a stacked form "
                          "(resnet8, resnet18, resnet50, cnn, fedadc_cnn, mlp, logreg; no projection_dim)")


def run(
    config: Config | Mapping[str, Any] | str | Path | None = None, overrides: list[str] | None = None, resume: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Run one federated experiment; ``config`` is a dict, a YAML path or a Config.

    ``resume=True``: continue the stopped run of this config in ``output.dir`` from its last
    checkpoint (see :func:`resume`). Raises :class:`fedrift.ConfigError` for bad input before
    anything is written, :class:`fedrift.DivergenceError` (carrying the partial result) if the
    loss goes non-finite, and on Ctrl-C ``KeyboardInterrupt`` (or :class:`fedrift.errors.ClusterLostError`
    when the Ray cluster is lost) after writing an ``interrupted`` summary (the exception's
    ``result`` holds the partial result; the checkpoint is kept for :func:`resume`). ``on_round(row)`` is called
    with each evaluated round's metrics (see :func:`fedrift.engine.loop.run_federation`).
    """
    started = time.perf_counter()  # the summary's run_seconds and setup_seconds count the data's loading too
    return run_prepared(prepare(config, overrides), resume=resume, on_round=on_round, started=started)


def resume(run_dir: str | Path, overrides: list[str] | None = None) -> RunResult:
    """Continue the stopped run in ``run_dir`` (killed, interrupted, crashed) from its last
    checkpoint, with the config it started with (its ``config.yaml``); ``overrides`` may change
    only keys that do not change results (``output.progress``, ``engine.checkpoint_every``,
    ``engine.ray_address``, an executor with equal results: ``engine/checkpoint.py``
    ``NOT_RESULTS``, ``EQUAL_EXECUTORS``). The result equals an uninterrupted run's bit for bit."""
    d = Path(run_dir)
    doc = apply_overrides(run_config(d), overrides or [], shared_options)
    doc["output"] = {**(doc.get("output") or {}), "dir": str(d), "overwrite": False}
    started = time.perf_counter()
    return run_prepared(prepare(doc), resume=True, started=started)


def run_config(run_dir: Path) -> dict[str, Any]:
    """The config a run folder's run started with, as fedrift wrote it (every section): a
    missing, empty, torn or foreign ``config.yaml`` is refused, never filled with defaults
    (which would run another experiment into the folder)."""
    path = run_dir / "config.yaml"
    if not path.is_file() or path.is_symlink():
        raise ConfigError(f"--resume: {str(run_dir)!r} holds no run (no config.yaml); allowed: a folder written by fedrift run")
    try:
        doc = read_yaml(path)
    except ConfigError as err:
        raise ConfigError(f"--resume: {err}; the run cannot continue without the config it started with") from None
    missing = [name for name in Config.model_fields if name not in doc]
    if missing:
        said = "is empty" if not doc else f"has no {missing[0]} section"
        raise ConfigError(
            f"--resume: {path} {said}, so it is not the whole config the run started with (a run stopped while "
            "writing it, or a file edited since); fedrift does not fill it with defaults; allowed: a run folder "
            "written whole by fedrift run, or start the run again: fedrift run -c YOUR.yaml "
            f"output.dir={run_dir} output.overwrite=true"
        )
    return doc


def run_prepared(prep: Prepared, resume: bool = False, on_round: Callable[[dict[str, Any]], None] | None = None,
                 executor: Any = None, started: float | None = None) -> RunResult:
    """Run from validated pieces (tests and tools may swap the partition first). ``executor``:
    the one to train with, instead of a new one of ``engine.executor`` (stacked runs hand
    each run its member of their stack: ``fedrift.experiments.stacked``). ``started``: when the
    run began (``time.perf_counter``: before its data was prepared), else now."""
    started = time.perf_counter() if started is None else started
    cfg = prep.config
    model, algorithm = build_run(prep)
    executor_name = resolve_executor(cfg, prep, model)
    if cfg.engine.compile:
        check_compile(cfg, executor_name, model)

    if resume and not cfg.output.dir:
        raise ConfigError("output.dir: resuming needs the run's folder; allowed: the folder of a stopped run")
    out_dir = run_folder(cfg)
    config_text = resolved_yaml(prep)
    doc = yamlio.load(config_text)
    doc["engine"].update(executor=executor_name, device=str(prep.device))  # as resolved: both change results
    checkpoints = Checkpointer(out_dir, doc, cfg.engine.checkpoint_every, data=dataset_fingerprint(prep.dataset),
                               accept_changed=cfg.data.accept_changed)
    snap = _resume_point(out_dir, checkpoints, prep.device) if resume else None
    if executor is None:
        executor = EXECUTORS.get(executor_name, "engine.executor").factory(cfg)
    if hasattr(executor, "use_prepared"):  # executors that ship the prepared data (ray)
        executor.use_prepared(prep)
    writer = RunWriter(out_dir, cfg.output.overwrite, resume=(snap.metrics_bytes if snap else 0) if resume else None,
                       resume_clients=snap.clients_csv_bytes if snap else 0)
    board = None
    try:  # the folder's lock, taken by the writer, is held until the last file is written
        if not resume:
            writer.write_text("config.yaml", config_text)
            writer.write_partition(prep.partition)
        if cfg.output.tensorboard:  # the event files see each metrics row as it is written
            with writing("output.tensorboard", "; allowed: a folder this user can write, on a disk with free space"):
                board = Board(out_dir, resume_from=(snap.round + 1 if snap else 1) if resume else None)
            on_round = _both(board.log, on_round)
        fed = Federation(prep.dataset, prep.partition, prep.device)
        facts = run_facts(prep, model, executor_name)
        threads = torch.get_num_threads()  # restored after the run
        if cfg.engine.threads is not None:
            torch.set_num_threads(cfg.engine.threads)
        facts["threads"] = torch.get_num_threads()
        try:
            with cudnn_choice(cfg):
                loop = _federate(cfg, fed, model, algorithm, executor, writer, checkpoints, snap, on_round, started)
        except OutputError as err:
            if isinstance(err, LinkRefused) or not checkpoints.exists():  # space alone would not help
                raise
            raise OutputError(f"{err}; with space again, continue with: fedrift run --resume {out_dir}") from None
        except (DivergenceError, ClusterLostError, KeyboardInterrupt) as err:
            partial = getattr(err, "result", None)
            if partial is not None:
                partial.summary.update(facts)
                writer.write_summary(partial.summary)
                err.result = RunResult(partial.history, partial.summary, {}, out_dir, cfg)  # type: ignore[union-attr]
            if isinstance(err, DivergenceError):
                checkpoints.remove()  # a diverged run is finished: nothing to continue
            raise
        finally:
            writer.close()
            if board is not None:
                board.close()
            executor.close()
            torch.set_num_threads(threads)
        state = final_state(loop.global_params, model)
        summary = {**loop.summary, **facts}
        if resume:
            summary["resumed_from_round"] = snap.round if snap else 0
        if cfg.output.save_model:
            writer.save_model(state)
        if loop.personalization is not None:
            writer.write_text("personalization.json", json.dumps(loop.personalization, indent=1) + "\n")
        writer.write_summary(summary)  # last: a completed summary means every file of the run is there
        checkpoints.remove()
        return RunResult(loop.history, summary, state, out_dir, cfg, loop.server_state)
    except FedriftError as err:
        if not resume and writer.rows == 0 and not isinstance(err, (DivergenceError, ClusterLostError, OutputError)):
            writer.discard()  # refused in round 1 (e.g. privacy's upload check): leave nothing behind
        raise
    finally:
        writer.release()


def _federate(cfg: Config, fed: Federation, model: FedModel, algorithm: Algorithm, executor: Any, writer: RunWriter,
              checkpoints: Checkpointer, snap: Snapshot | None, on_round: Callable[[dict[str, Any]], None] | None,
              started: float) -> Any:
    """``run_federation``, with an OSError on a file of the run folder (the client-state
    store on disk) turned into an OutputError."""
    try:
        return run_federation(cfg, fed, model, algorithm, executor, writer, checkpoints, snap, on_round, started)
    except OSError as err:
        if not _inside(err.filename, writer.dir):
            raise
        raise OutputError(f"output.dir: {describe_os_error(err)}; allowed: a disk with free space") from None


def _resume_point(out_dir: Path, checkpoints: Checkpointer, device: torch.device) -> Snapshot | None:
    """The checkpoint a stopped run in ``out_dir`` continues from (None: from round 1);
    refuses a folder with no run, a finished run, and a checkpoint it cannot trust."""
    if not (out_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume: {str(out_dir)!r} holds no run (no config.yaml); allowed: a folder written by fedrift run")
    try:
        summary = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None  # killed: no summary (or a torn one)
    status = summary.get("status") if isinstance(summary, dict) else None
    if status in ("completed", "diverged"):
        raise ConfigError(f"--resume: the run in {str(out_dir)!r} has {status}; there is nothing to continue")
    snap = checkpoints.load(device)
    if snap is None:
        return None
    for name, size, sha in (("metrics.jsonl", snap.metrics_bytes, snap.metrics_sha256),
                            (CLIENTS, snap.clients_csv_bytes, snap.clients_csv_sha256)):
        path = out_dir / name
        have = path.stat().st_size if path.is_file() else 0
        if (size or name != CLIENTS) and (have < size or prefix_sha256(path, size) != sha):  # no rows: nothing to check
            raise CheckpointError(
                f"{path}: its first {size} bytes, the rounds up to the checkpoint of round {snap.round}, "
                "were cut or changed since, so the run cannot continue: delete the folder to run again from round 1"
            )
    return snap


def _inside(name: Any, folder: Path) -> bool:
    """Whether the file ``name`` (an OSError's filename, or None) lies in ``folder``."""
    if name is None:
        return False
    try:
        return Path(os.fsdecode(name)).resolve().is_relative_to(folder.resolve())
    except (TypeError, ValueError, OSError):
        return False


def _both(first: Callable[[dict[str, Any]], None], then: Callable[[dict[str, Any]], None] | None):
    """One ``on_round`` callback that calls ``first``, then ``then`` (when given)."""

    def call(row: dict[str, Any]) -> None:
        first(row)
        if then is not None:
            then(row)
    return call
