"""The server half of a run: its state, sampling, broadcast, the optional pre-phase,
aggregation, evaluation, logging and checkpoints.

A round is ``open`` (the sampled clients, the payload, their jobs), then, for algorithms
with a pre-phase, ``combine`` (the clients' summaries), then ``close`` (the clients'
outputs). Who runs the clients between ``open`` and ``close`` is not the server's business:
the in-process loop hands the jobs to an executor (``engine.loop``), a Flower ServerApp sends
them as messages to devices. Both call the same client function (``engine.client``).
An executor that trains in this process hands each output to ``take`` as it is made: with a
streamed aggregate (``Algorithm.sums``) the upload is folded into running sums then, and the
round never holds K uploads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from fedrift.algorithms.base import Algorithm, RoundInfo, sum_weights
from fedrift.config import Config
from fedrift.engine.augment import Augment
from fedrift.engine.calibrate import calibration_metrics
from fedrift.engine.checkpoint import Checkpointer, Snapshot, prefix_sha256
from fedrift.engine.failures import DivergenceBound, Fates, fates, update_norm
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.local import make_tools
from fedrift.engine.outputs import CLIENTS, RunWriter
from fedrift.engine.privacy import Accountant, private_mean
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.engine.sampling import SAMPLERS, cohort_size, eval_clients
from fedrift.engine.state import ClientStateStore
from fedrift.engine.teacher import with_teacher
from fedrift.functional.tree import RunningSum, all_finite, shares_memory, signature, stack, tree_bytes
from fedrift.errors import ConfigError, DivergenceError, FedriftError, NoClientsError
from fedrift.metrics.client_spread import SPREAD, ClientScores
from fedrift.metrics.drift import drift_metrics, probe_indices
from fedrift.metrics.evaluate import LocalParts, evaluate, evaluate_personal
from fedrift.models.base import FedModel
from fedrift.models.norm import model_state, running_stat_names

log = logging.getLogger("fedrift")


class UploadStack:
    """The round's uploads stacked into last round's stack when the server state kept no part
    of it: a fresh stack each round (330 MB for 50 FedAvg CNNs) costs more in page faults
    than in copying (BENCHMARKS.md, S2). Only with ``reuse``: for executors whose training
    holds no more than the round's outputs (one client at a time), where the kept stack
    raises no peak; beside the batched executor's vectorised groups it would (S4: 1,923 to
    2,058 MB, measured)."""

    def __init__(self, reuse: bool) -> None:
        self.reuse = reuse
        self.tree: dict[str, Any] | None = None

    def __call__(self, uploads: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.reuse:
            return stack(uploads)
        want = [(p, (len(uploads), *s), d) for p, s, d in signature(uploads[0])]
        if self.tree is not None and signature(self.tree) == want:
            return stack(uploads, out=self.tree)
        self.tree = stack(uploads)
        return self.tree

    def release_if_held(self, state: dict[str, Any]) -> None:
        """Never write into memory the server state still reads."""
        if self.tree is not None and shares_memory(state, self.tree):
            self.tree = None


@dataclass
class LoopResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    global_params: dict[str, torch.Tensor] = field(default_factory=dict)
    server_state: dict[str, Any] = field(default_factory=dict)
    personalization: dict[str, Any] | None = None


@dataclass
class Round:
    """One round as the server opened it. ``jobs`` are the returning clients' work (batch
    schedule and context, with their stored state); ``tools`` carry the round's teacher table
    when the server built one. ``down``/``up`` count the bytes sent so far (a deployment may
    replace them by its transport's real sizes)."""

    t: int
    info: RoundInfo
    sampled: list[int]
    fate: Fates
    payload: dict[str, Any]
    jobs: list[ClientJob]
    weights: torch.Tensor
    tools: RoundTools
    down: int
    up: int = 0
    start: float = 0.0
    sums: dict[str, RunningSum] | None = None  # streamed aggregation: the running sums (Server.take)
    stats: RunningSum | None = None  # ... and of the uploaded BatchNorm statistics (Server.average_stats)
    taken: dict[int, int] = field(default_factory=dict)  # client id -> upload bytes, once taken
    norms: dict[int, float | None] = field(default_factory=dict)  # client id -> update norm (DivergenceBound)
    waiting: dict[int, ClientOutput] = field(default_factory=dict)  # arrived ahead of job order

    @property
    def needs_summaries(self) -> bool:
        """Whether the algorithm has a pre-phase: ``Server.combine`` before training."""
        return self.tools.algorithm.client_summary is not None


class Server:
    """The server's state and its side of every round (see the module's docstring).

    ``clients_build_teacher``: the clients compute their teacher rows themselves (worker
    processes, Ray actors, devices), so the server builds no teacher table unless a pre-phase
    it runs itself reads it (``prephase_on_clients``: the clients run it too, as devices do).
    ``reuse_uploads``: see :class:`UploadStack`. ``hands_over``: the executor trains in this
    process and hands each output to :meth:`take` as it is made. ``extra_state``: what the executor keeps
    between rounds, saved with each checkpoint.
    """

    def __init__(
        self, cfg: Config, fed: Federation, model: FedModel, algorithm: Algorithm, writer: RunWriter,
        checkpoints: Checkpointer | None = None, resume: Snapshot | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None, clients_build_teacher: bool = False,
        reuse_uploads: bool = False, extra_state: Callable[[], Any] | None = None, prephase_on_clients: bool = False,
        hands_over: bool = False, started: float | None = None,
    ) -> None:
        tc = cfg.train
        self.cfg, self.fed, self.model, self.algorithm, self.writer = cfg, fed, model, algorithm, writer
        self.checkpoints, self.on_round, self.extra_state = checkpoints, on_round, extra_state
        self.clients_build_teacher = clients_build_teacher
        self.prephase_on_clients = prephase_on_clients
        self.m = cohort_size(fed.num_clients, tc.clients_per_round, tc.participation)
        self.sampler = SAMPLERS.get(cfg.engine.sampling, "engine.sampling").factory
        model = model.to(fed.device)
        params = model_state(model)  # the parameters, and BatchNorm's running statistics (models/norm.py)
        # BatchNorm: the new global statistics are the weighted average of the uploaded ones,
        # whatever the algorithm does with the parameters (average_stats); personal models keep
        # theirs, and a client model (FedBN) says itself what is shared
        self.stat_keys = running_stat_names(model)
        self.per_client = algorithm.personal or algorithm.client_model is not None  # evaluated per client
        self.averages_stats = bool(self.stat_keys) and not self.per_client
        if self.stat_keys and cfg.eval.personalize:
            raise ConfigError("eval.personalize: classifier calibration keeps the body as the global model's, which "
                              "BatchNorm's train-mode statistics would change; allowed: false with model.norm batch")
        self.tools = make_tools(model, algorithm, tc, fed.x, fed.y, cfg.seed, cfg.eval.batch_size, fed.prepare,
                                Augment.from_config(cfg.data), cfg.privacy)
        self.accountant = None if cfg.privacy.level == "none" else Accountant(
            cfg.privacy, self.m, fed.num_clients, list(fed.sizes), tc.batch_size, tc.local_epochs, tc.local_steps)
        self.epsilon = None
        self.store = ClientStateStore(algorithm.init_client, params, mode=cfg.engine.client_state,
                                      path=writer.dir / "client_state.bin", num_clients=fed.num_clients)
        self.state = algorithm.init_server(params)
        self.uniform = algorithm.hparams.aggregation == "uniform"
        self.uploads = UploadStack(reuse=reuse_uploads)
        # uploads folded into running sums as they arrive (Server.take): when the aggregate
        # reads only sums and nothing else needs the round's uploads or local models
        self.streams = (algorithm.aggregate_sums is not None and cfg.privacy.level != "client"
                        and not cfg.engine.accept_failures and not cfg.eval.drift)
        # ... and, when the clients train in this process and hand their outputs over, each
        # client's stored state is read when it trains, not all K at open (S4)
        self.late_states = (self.streams and hands_over and algorithm.init_client is not None
                            and algorithm.client_summary is None  # a pre-phase reads the job's ctx
                            and not self.per_client)  # so does the batched executor's start
        self.panel = eval_clients(fed.num_clients, cfg.eval.clients_sample, cfg.seed)  # personal models: whose
        self.probe = probe_indices(len(fed.y_test), cfg.eval.probe_size, cfg.seed).to(fed.device)
        # test_*, then val_* on the union of the clients' validation splits (partition.val_share)
        self.evaluated = [("test", fed.x_test, fed.y_test)] + (
            [("val", fed.x_val, fed.y_val)] if len(fed.y_val) else [])
        # a global model's local_accuracy: on the panel clients' own test splits (not their
        # validation ones: the tuner scores a personal model's val_local_accuracy, a global one's val_accuracy)
        self.local_test = None if self.per_client else LocalParts([fed.test_indices(k) for k in self.panel])
        self.out = LoopResult()
        self.calibrated: dict[str, torch.Tensor] | None = None  # the last calibrated model (Algorithm.calibration)
        self.totals: dict[str, Any] = {"bytes_down": 0, "bytes_up": 0, "seconds": 0.0, "clients_returned": 0,
                                       "clients_dropped": 0, "clients_failed": 0, "clients_straggling": 0}
        self.best: tuple[float, int] = (-1.0, 0)
        self.first = 1
        if resume is not None:
            assert checkpoints is not None
            self.state, self.out.history, self.totals, self.best = resume.server, resume.history, resume.totals, tuple(resume.best)
            checkpoints.load_clients(resume, self.store)
            if self.tools.teacher_memo is not None and resume.memo is not None:
                self.tools.teacher_memo.load(resume.memo)
            if self.accountant is not None:  # its rounds so far, not saved: composed again
                self.epsilon = self.accountant.step(resume.round)
            self.first = resume.round + 1
        # the run's own time (its start-up, every round's evaluation and checkpoints): resumes add theirs
        self.started = time.perf_counter() if started is None else started
        self.totals.setdefault("run_seconds", 0.0)
        self.prior_seconds = float(self.totals["run_seconds"])
        self.totals.setdefault("setup_seconds", time.perf_counter() - self.started)
        self.closed = self.first - 1  # the last round whose state is whole (closed)
        self.touched = False  # whether the round in progress changed the state or the store already
        self.bound = DivergenceBound(cfg.engine.divergence_factor, cfg.engine.divergence_loss, self.totals)
        self.t = self.first - 1
        self.bar = tqdm(total=tc.rounds, initial=self.first - 1, desc=algorithm.name, unit="round",
                        disable=None if cfg.output.progress else True)

    def rounds(self) -> range:
        """The rounds still to run."""
        return range(self.first, self.cfg.train.rounds + 1)

    def open(self, t: int) -> Round:
        """Sample round ``t``'s clients, broadcast, and plan the work of those that return.
        The round's tools and algorithm are those at its learning rate (``train.lr_schedule``):
        broadcast, training and aggregation all see the lr the clients train with."""
        cfg, fed = self.cfg, self.fed
        base = self.tools.at_round(t)
        alg = base.algorithm
        self.t = t
        start = time.perf_counter()
        sampled = self.sampler(fed.num_clients, self.m, cfg.seed, t, fed.label_counts_np, retries=cfg.engine.sampling_retries)
        info = RoundInfo(round=t, num_clients=fed.num_clients, sampled=tuple(sampled))
        payload = alg.broadcast(self.state, info)
        fate = fates(cfg.engine, cfg.seed, t, sampled)
        if not fate.returning:
            self.totals["clients_dropped"] += len(fate.dropped)  # the round that stops the run counts too
            raise self._no_clients(t, f"all {len(sampled)} sampled clients dropped out (engine.dropout)")
        jobs = [client_job(fed, k, {} if self.late_states else self.store.get(k), cfg.train, cfg.seed, t,
                           work=fate.work.get(k, 1.0)) for k in fate.returning]
        if self.late_states:
            for job in jobs:
                job.state_from = partial(self.store.get, job.client_id)
        down = len(sampled) * tree_bytes(payload)  # the dropped received the broadcast too
        weights = self.weights(fate.returning)
        # the teacher table sees the broadcast payload; the pre-phase may read it. Clients that
        # build their own rows (workers, actors, devices) need none unless the server runs a
        # pre-phase that reads it.
        own = self.clients_build_teacher and (alg.client_summary is None or self.prephase_on_clients)
        tools = base if own else with_teacher(base, payload, jobs, cfg.engine.teacher_cache)
        sums = None
        if self.streams:
            w = weights.to(fed.device)
            sums = {f: RunningSum(sum_weights(kind, w)) for f, kind in alg.sums.items()}
        stats = RunningSum(weights.to(fed.device)) if sums is not None and self.averages_stats else None
        return Round(t, info, list(sampled), fate, payload, jobs, weights, tools, down, 0, start, sums, stats)

    def take(self, rnd: Round, out: ClientOutput) -> None:
        """One client's output as soon as it exists (executors that train in this process call
        it): with streamed aggregation, its state goes to the store and its upload into the
        round's running sums, in job order (one that arrives early waits), and both are
        dropped, so a round holds one client's upload, not K of them. Otherwise nothing:
        ``close`` gets the outputs whole."""
        if rnd.sums is None or out.client_id in rnd.taken:
            return
        rnd.waiting[out.client_id] = out
        while len(rnd.taken) < len(rnd.jobs) and (nxt := rnd.jobs[len(rnd.taken)].client_id) in rnd.waiting:
            o = rnd.waiting.pop(nxt)
            if self.bound.factor is not None:  # before the upload is dropped
                rnd.norms[o.client_id] = update_norm(o.upload, rnd.payload)
            self._keep_state(o)
            for f, acc in rnd.sums.items():
                acc.add(o.upload[f])
            if rnd.stats is not None:
                rnd.stats.add(self._stats(o))
            rnd.taken[o.client_id] = tree_bytes(o.upload)
            o.upload, o.end_params = {}, {}

    def _keep_state(self, out: ClientOutput) -> None:
        """The client's new state into the store, and out of the output (None: a device keeps
        its state itself)."""
        if out.state is not None and self.algorithm.init_client is not None:
            self.touched = True
            self.store.put(out.client_id, out.state)
            out.state = None

    def combine(self, rnd: Round, summaries: list[dict[str, Any]]) -> None:
        """The pre-phase's server side: the clients' summaries (in job order) combined with the
        round's aggregation weights; the result joins the payload that goes down."""
        extra = rnd.tools.algorithm.pre_combine(rnd.payload, stack(summaries), rnd.weights.to(self.fed.device))
        rnd.payload = {**rnd.payload, **extra}
        rnd.down += len(rnd.jobs) * tree_bytes(extra)
        rnd.up += sum(tree_bytes(s) for s in summaries)

    def close(self, rnd: Round, outputs: list[ClientOutput], failed: list[int], up: int | None = None,
              diverged: Sequence[int] = ()) -> dict[str, Any] | None:
        """Aggregate the outputs (in job order) of the clients that returned, keep their
        states, evaluate and log when due, checkpoint when due; the round's metrics row, or
        None when the round is not evaluated. ``up``: the bytes uploaded, when the transport
        measured them (else the uploads' tensor bytes). ``diverged``: those of ``failed`` whose
        training loss was not finite (``engine.accept_failures`` left them out): counted, and
        a run that has any ends as diverged in effect (:meth:`diverged_in_effect`).
        A finite loss or update beyond ``engine.divergence_*`` (:class:`DivergenceBound`) is a
        divergence too: it stops the run, or under ``engine.accept_failures`` the client is
        left out here and counted as diverged."""
        cfg, fed, alg, t, tc = self.cfg, self.fed, rnd.tools.algorithm, rnd.t, self.cfg.train
        self.touched = True  # from here on the state is neither round t-1's nor (until the end) round t's
        for o in outputs:
            if self.bound.factor is not None and o.client_id not in rnd.norms:
                rnd.norms[o.client_id] = update_norm(o.upload, rnd.payload)
        self.bound.learn(outputs, rnd.norms)  # the first round's sets the reference
        beyond = self.bound.judge(outputs, rnd.norms)
        if beyond and cfg.engine.accept_failures:
            for k, why in beyond.items():
                log.warning(f"round {t}: client {k} {why}; it is left out (engine.accept_failures)")
            outputs = [o for o in outputs if o.client_id not in beyond]
            failed, diverged = sorted([*failed, *beyond]), sorted([*diverged, *beyond])
            beyond = {}
        counts = {"clients_returned": len(outputs), "clients_dropped": len(rnd.fate.dropped),
                  "clients_failed": len(failed), "clients_straggling": len(rnd.fate.work)}
        for key, value in counts.items():  # before any stop: the round that stops the run counts too
            self.totals[key] += value
        if diverged:
            self.totals["clients_diverged"] = self.totals.get("clients_diverged", 0) + len(diverged)
            self.totals.setdefault("first_diverged_round", t)
        if not outputs:
            raise self._no_clients(t, f"all {len(rnd.jobs)} clients that trained failed (engine.accept_failures)")
        info, weights = rnd.info, rnd.weights
        if failed:  # the others' weights renormalised; the aggregation sees who returned
            weights = self.weights([o.client_id for o in outputs])
            info = replace(info, sampled=tuple(o.client_id for o in outputs))
        elif rnd.fate.dropped:
            info = replace(info, sampled=tuple(rnd.fate.returning))

        losses = torch.stack([o.loss.double().cpu() for o in outputs])
        bad = [o.client_id for o, ok in zip(outputs, torch.isfinite(losses)) if not ok]
        if bad:
            raise self._diverged(t, f"client {bad[0]} produced a non-finite training loss")
        if beyond:  # without accept_failures: the first finite blow-up stops the run
            k = min(beyond, key=[o.client_id for o in outputs].index)
            raise self._diverged(t, f"client {k} {beyond[k]}")
        if rnd.sums is not None:  # streamed: whatever the executor did not hand over already
            for o in outputs:
                self.take(rnd, o)
            self.state = alg.aggregate_sums(self.state, {f: acc.result() for f, acc in rnd.sums.items()}, info)
        else:
            self._aggregate(rnd, outputs, weights, info)
        if self.averages_stats:
            self.average_stats(rnd, outputs, weights)
        if self.accountant is not None:
            self.epsilon = self.accountant.step()
        self.uploads.release_if_held(self.state)
        if not all_finite(self.state["params"]):
            raise self._diverged(t, "the aggregated global model has non-finite parameters")
        up_bytes = rnd.up + (sum(rnd.taken.values()) + sum(tree_bytes(o.upload) for o in outputs) if up is None else up)
        seconds = time.perf_counter() - rnd.start
        self.totals["bytes_down"] += rnd.down
        self.totals["bytes_up"] += up_bytes
        self.totals["seconds"] += seconds

        row = None
        cal = self.algorithm.calibration
        if t % cfg.eval.every == 0 or t == tc.rounds or (cal is not None and cal.at is not None and t in cal.at):
            scores: dict[str, ClientScores] = {}  # per panel client, by scored model (clients.csv)
            row = {"round": t, **self.evaluate(scores, t), **self.calibrate(t, scores), **_aux_metrics(outputs, weights)}
            if cfg.eval.drift:
                local = [o.end_params for o in outputs]
                row.update(drift_metrics(self.tools.apply, rnd.payload["params"], local, fed.x_test, fed.y_test,
                                         self.probe, self.tools.eval_batch))
            row.update(
                train_loss=float((weights * losses).sum()),
                seconds=seconds,
                wall_seconds=self.totals["seconds"],
                bytes_down=rnd.down,
                bytes_up=up_bytes,
                clients=len(rnd.sampled),
                lr=rnd.tools.lr,
                **counts,
            )
            if self.accountant is not None:
                row["epsilon"] = self.epsilon
            for model, sc in scores.items():  # the round's clients.csv rows, just before its metrics line
                self.writer.log_clients(t, model, self.panel, sc)
            self.writer.log(row)
            self.out.history.append(row)
            if self.on_round is not None:
                self.on_round(row)
            if "test_accuracy" in row:  # not at every round for per-client models (eval.per_client_test)
                if row["test_accuracy"] > self.best[0]:
                    self.best = (row["test_accuracy"], t)
                self.bar.set_postfix(acc=f"{row['test_accuracy']:.3f}", best=f"{self.best[0]:.3f}")
            else:
                self.bar.set_postfix(local=f"{row.get('local_accuracy', float('nan')):.3f}")
        if self.checkpoints is not None and self.checkpoints.due(t, tc.rounds):
            self.checkpoint(t)
        self.closed, self.touched = t, False
        self.bar.update(1)
        return row

    def evaluate(self, scores: dict[str, ClientScores] | None = None, t: int | None = None) -> dict[str, float]:
        """The global model (or, for personal algorithms and client models, each client's own:
        every client up to ``eval.clients_sample`` clients, else a seeded panel of that many) on
        the test set and the validation union; each client's own model on those whole sets only
        where ``eval.per_client_test`` says, at round ``t`` (else on its own samples alone:
        the local accuracies). ``scores``: filled with the panel clients' counts
        on their local test splits, under ``global`` or ``personal`` (``_<name>`` for an extra
        predictor: ``personal_proto``)."""
        fed, alg, apply, chunk = self.fed, self.algorithm, self.tools.apply, self.tools.eval_batch
        predict = partial(alg.predict, self.state, apply=apply) if alg.predict is not None else None
        row: dict[str, float] = {}
        ev = self.cfg.eval
        whole = (ev.per_client_test == "every" or t is None or t in ev.at_rounds or t == self.cfg.train.rounds)
        for prefix, x_eval, y_eval in self.evaluated:
            own: dict[str, ClientScores] | None = {} if prefix == "test" else None
            if self.per_client:  # each panel client's own model, as the store holds it now
                models = (self.client_model(k) for k in self.panel)  # one at a time
                local = [fed.test_indices(k) if prefix == "test" else fed.val_positions(k) for k in self.panel]
                row.update(evaluate_personal(apply, models, local, x_eval, y_eval, chunk, predict, prefix, scores=own,
                                             whole=whole))
            else:
                local_parts = self.local_test if prefix == "test" else None
                row.update(evaluate(apply, self.state["params"], x_eval, y_eval, chunk, predict, prefix, local_parts,
                                    scores=own))
            if scores is not None and own:
                model = "personal" if self.per_client else "global"
                scores.update({model + (f"_{name}" if name else ""): sc for name, sc in own.items()})
        return row

    def client_model(self, k: int) -> dict[str, torch.Tensor]:
        """Client ``k``'s model now: its own (personal), or the server's model joined with the
        part it keeps (``Algorithm.client_model``, FedBN: its BatchNorm)."""
        state = self.store.get(k)
        return state["params"] if self.algorithm.personal else self.algorithm.client_model(self.state, state)

    def calibrate(self, t: int, scores: dict[str, ClientScores] | None = None) -> dict[str, float]:
        """The algorithm's calibrated model (CCVR) from the panel clients' statistics of the
        global model, evaluated as it is (``engine.calibrate``); {} without one, or where it
        does not calibrate at ``t`` (``Calibration.due``: no statistics gathered, no bytes). It
        is kept as the run's final model, and never goes down to the clients. ``scores``: as in
        :meth:`evaluate`, under ``calibrated``."""
        cal = self.algorithm.calibration
        if cal is None or not cal.due(t, self.cfg.train.rounds):
            return {}
        prefixes = getattr(self.model, "head_prefixes", ("fc",))
        params = self.state["params"]
        head = {k for k in params if k.split(".")[0] in prefixes}
        own: dict[str, ClientScores] = {}
        try:
            row, self.calibrated = calibration_metrics(self.algorithm, params, self.fed, self.panel, self.tools.apply,
                                                       head, t, self.tools.eval_batch, self.evaluated, self.local_test,
                                                       self.tools.vmap_apply, scores=own)
        except FloatingPointError as err:  # statistics of a diverged model: the run ends as diverged
            raise self._diverged(t, str(err)) from None
        if scores is not None:
            scores.update({"calibrated" + (f"_{name}" if name else ""): sc for name, sc in own.items()})
        return row

    def keep_on_stop(self) -> None:
        """A stop (Ctrl-C, SIGTERM, a budget, a lost cluster): the checkpoint of the last whole
        round, whatever ``engine.checkpoint_every`` says, so the next call continues from there;
        none when the round in progress had changed the state or the client store already (a
        stop inside the aggregation), nor after the last round (the run ends there)."""
        c = self.checkpoints
        if c is None or self.touched or self.closed <= c.last_round or self.closed >= self.cfg.train.rounds:
            return
        try:
            self.checkpoint(self.closed)
        except (FedriftError, OSError, KeyboardInterrupt) as err:  # the stop goes on; the last checkpoint stays
            log.warning(f"the checkpoint of round {self.closed} was not saved at the stop ({err or 'a second stop'})")

    def run_seconds(self) -> float:
        """The run's time so far: start-up, rounds, evaluation, checkpoints (and earlier calls')."""
        return self.prior_seconds + time.perf_counter() - self.started

    def checkpoint(self, t: int) -> None:
        assert self.checkpoints is not None
        self.totals["run_seconds"] = self.run_seconds()
        memo = self.tools.teacher_memo.dump() if self.tools.teacher_memo is not None else None
        extra = self.extra_state() if self.extra_state is not None else None
        size, rows = self.writer.sync(), self.writer.clients_bytes
        snap = Snapshot(t, self.state, self.out.history, self.totals, self.best, size,
                        prefix_sha256(self.writer.dir / "metrics.jsonl", size), memo, extra,
                        clients_csv_bytes=rows,
                        clients_csv_sha256=prefix_sha256(self.writer.dir / CLIENTS, rows) if rows else "")
        self.checkpoints.save(snap, self.store)

    def _aggregate(self, rnd: Round, outputs: list[ClientOutput], weights: torch.Tensor, info: RoundInfo) -> None:
        """The whole round's uploads at once: stacked (or privately averaged), then ``aggregate``."""
        cfg, alg = self.cfg, rnd.tools.algorithm
        for o in outputs:  # stored now: not held beside the stacked uploads
            self._keep_state(o)
        if cfg.privacy.level == "client":  # one upload, the noised mean of the clipped models
            stacked, agg_weights = private_mean([o.upload for o in outputs], rnd.payload["params"], cfg.privacy,
                                                cfg.seed, rnd.t, alg.name)
        else:
            stacked, agg_weights = self.uploads([o.upload for o in outputs]), weights.to(self.fed.device)
        self.state = alg.aggregate(self.state, stacked, agg_weights, info)

    def average_stats(self, rnd: Round, outputs: list[ClientOutput], weights: torch.Tensor) -> None:
        """BatchNorm's new global running statistics: ``sum_k p_k s_k`` over the uploaded ones
        with the round's aggregation weights (as FedAvg over a state_dict), in place of whatever
        the algorithm's aggregate made of them (``models/norm.py``)."""
        if rnd.stats is not None:  # streamed: summed as the uploads arrived (take)
            mean = rnd.stats.result()
        else:
            acc = RunningSum(weights.to(self.fed.device))
            for o in outputs:
                acc.add(self._stats(o))
            mean = acc.result()
        self.state = {**self.state, "params": {**self.state["params"], **mean}}

    def _stats(self, out: ClientOutput) -> dict[str, torch.Tensor]:
        """The running statistics a client uploaded with its parameters."""
        params = out.upload["params"]
        return {k: params[k] for k in self.stat_keys}

    def weights(self, clients: list[int]) -> torch.Tensor:
        """Aggregation weights over the clients that return: p_k by samples, or uniform."""
        n = torch.tensor([float(self.fed.sizes[k]) for k in clients], dtype=torch.float64)
        return torch.full_like(n, 1.0 / len(n)) if self.uniform else n / n.sum()

    def release(self) -> None:
        """Close the progress bar and the client-state store (its disk file is deleted)."""
        self.bar.close()
        self.store.close()

    def result(self, status: str = "completed", message: str = "") -> LoopResult:
        """The run's result so far: history, summary, and (completed) the final state."""
        out, tc = self.out, self.cfg.train
        self.totals["run_seconds"] = self.run_seconds()
        if status == "completed":
            # a calibrated model (CCVR) is the run's final model; the trained one stays in server_state
            out.global_params = self.calibrated if self.calibrated is not None else self.state["params"]
            out.server_state = self.state
        out.summary = _summary(out, self.totals, self.best, tc.rounds, status, message)
        if status == "completed":
            if self.accountant is not None:
                out.summary.update(epsilon=self.epsilon, delta=self.cfg.privacy.delta)
            if self.cfg.eval.at_rounds:
                at = {r["round"]: r.get("test_accuracy") for r in out.history}
                out.summary["accuracy_at"] = {str(r): at.get(r) for r in self.cfg.eval.at_rounds}
            if out.personalization is not None:
                out.summary.update({k: v for k, v in out.personalization.items() if k != "clients"})
        return out

    def diverged_in_effect(self) -> DivergenceError | None:
        """A run that went through its rounds while some clients' training diverged (non-finite
        losses, left out under ``engine.accept_failures``): the global model followed the
        survivors of a diverging training, so the run ends as a run without accept_failures
        would, diverged (the metrics of every round kept)."""
        n = self.totals.get("clients_diverged", 0)
        if not n:
            return None
        return DivergenceError(
            f"training diverged in effect: {n} client trainings from round {self.totals['first_diverged_round']} on "
            "returned a non-finite loss, or a loss or update beyond engine.divergence_*, and were left out "
            "(engine.accept_failures), and the global model followed the others'; the metrics of every round "
            f"are kept in {self.writer.dir / 'metrics.jsonl'} (try a lower train.lr or set train.clip_grad_norm)")

    def interrupted(self) -> str:
        """The message of a run stopped by Ctrl-C in round ``self.t``."""
        out, checkpoints = self.out, self.checkpoints
        done = int(out.history[-1]["round"]) if out.history else 0
        where = (f"; it continues from the checkpoint of round {checkpoints.last_round}"
                 if checkpoints and checkpoints.last_round else "; it starts again from round 1 (no checkpoint yet)")
        return (
            f"interrupted in round {self.t} (metrics up to round {done} kept in {self.writer.dir / 'metrics.jsonl'}); "
            f"continue with: fedrift run --resume {self.writer.dir}{where}"
        )

    def _no_clients(self, t: int, what: str) -> NoClientsError:
        return NoClientsError(
            f"round {t}: no client returned ({what}); the run stopped and the metrics of earlier "
            f"rounds are kept in {self.writer.dir / 'metrics.jsonl'}"
        )

    def _diverged(self, t: int, what: str) -> DivergenceError:
        return DivergenceError(
            f"training diverged in round {t}: {what}; the run stopped and the metrics of earlier "
            f"rounds are kept in {self.writer.dir / 'metrics.jsonl'} (try a lower train.lr or set train.clip_grad_norm)"
        )


def _aux_metrics(outputs: list[ClientOutput], weights: torch.Tensor) -> dict[str, float]:
    """The p_k-weighted mean over clients of each scalar the local losses reported."""
    keys = sorted({k for o in outputs for k in o.aux})
    out = {}
    for k in keys:
        vals = torch.stack([o.aux[k].double().cpu() if k in o.aux else torch.tensor(float("nan")) for o in outputs])
        out[k] = float((weights.cpu() * vals).sum())
    return out


def best_validation(history: list[dict[str, Any]]) -> dict[str, Any]:
    """``best_val_accuracy``, ``best_val_round`` (the first evaluated round with the best
    validation accuracy) and ``test_accuracy_at_best_val`` (the test accuracy of that round:
    the model validation selects, never chosen by the test set); {} without validation."""
    rows = [r for r in history if r.get("val_accuracy") is not None]
    if not rows:
        return {}
    pick = max(rows, key=lambda r: r["val_accuracy"])  # the first of equals
    return {"best_val_accuracy": pick["val_accuracy"], "best_val_round": pick["round"],
            "test_accuracy_at_best_val": pick.get("test_accuracy")}


def _summary(out: LoopResult, totals: dict, best: tuple[float, int], rounds: int, status: str, message: str = "") -> dict:
    last = out.history[-1] if out.history else {}
    done = int(last.get("round", 0))
    summary: dict[str, Any] = {
        "status": status,
        "final_accuracy": last.get("test_accuracy"),
        "final_loss": last.get("test_loss"),
        "best_accuracy": best[0] if best[1] else None,
        "best_round": best[1] or None,
        **best_validation(out.history),
        "rounds": done,
        "rounds_planned": rounds,
        "wall_seconds": totals["seconds"],
        "seconds_per_round": totals["seconds"] / done if done else None,
        "run_seconds": totals.get("run_seconds"),
        "setup_seconds": totals.get("setup_seconds"),
        "bytes_down_total": totals["bytes_down"],
        "bytes_up_total": totals["bytes_up"],
        **{f"{k}_total": totals[k] for k in ("clients_returned", "clients_dropped", "clients_failed", "clients_straggling")},
    }
    # on the clients' own test splits (each one's model, or the global one), and its spread over the clients
    for key in ("local_accuracy", *(f"local_accuracy_{s}" for s in SPREAD)):
        if key in last:
            summary[f"final_{key}"] = last[key]
    # the calibrated model's (CCVR), beside them
    for key in ("calibrated_accuracy", "calibrated_local_accuracy", *(f"calibrated_local_accuracy_{s}" for s in SPREAD)):
        if key in last:
            summary[key] = last[key]
    if message:
        summary["message"] = message
    return summary
