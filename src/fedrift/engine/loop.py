"""The round loop, written once: sample, broadcast, train locally, aggregate, evaluate, log."""

from __future__ import annotations

import time
from functools import partial
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from fedrift.algorithms.base import Algorithm, RoundInfo
from fedrift.config import Config
from fedrift.engine.augment import Augment
from fedrift.engine.checkpoint import Checkpointer, Snapshot, prefix_sha256
from fedrift.engine.executors.base import ClientJob, Executor, RoundTools
from fedrift.engine.failures import fates, train_clients
from fedrift.engine.federation import Federation, client_job
from fedrift.engine.privacy import Accountant, private_mean
from fedrift.engine.local import make_tools
from fedrift.engine.outputs import RunWriter
from fedrift.engine.sampling import SAMPLERS, cohort_size, eval_clients
from fedrift.engine.state import ClientStateStore
from fedrift.engine.tree import all_finite, shares_memory, signature, stack, tree_bytes
from fedrift.errors import DivergenceError, NoClientsError
from fedrift.metrics.drift import drift_metrics, probe_indices
from fedrift.metrics.evaluate import evaluate, evaluate_personal
from fedrift.engine.personalize import personalize
from fedrift.engine.teacher import with_teacher
from fedrift.models.base import FedModel


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


def run_federation(
    cfg: Config,
    fed: Federation,
    model: FedModel,
    algorithm: Algorithm,
    executor: Executor,
    writer: RunWriter,
    checkpoints: Checkpointer | None = None,
    resume: Snapshot | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> LoopResult:
    """Rounds 1..``train.rounds`` (from ``resume.round + 1`` when given a checkpoint's
    snapshot), saving a checkpoint when ``checkpoints`` says one is due. ``on_round`` sees
    each evaluated round's metrics row once it is written (a tuner's pruner reads them; an
    exception it raises stops the run there, with the metrics so far kept)."""
    tc, device = cfg.train, fed.device
    m = cohort_size(fed.num_clients, tc.clients_per_round, tc.participation)
    sampler = SAMPLERS.get(cfg.engine.sampling, "engine.sampling").factory
    model = model.to(device)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    tools = make_tools(model, algorithm, tc, fed.x, fed.y, cfg.seed, cfg.eval.batch_size, fed.prepare,
                       Augment.from_config(cfg.data), cfg.privacy)
    accountant = None if cfg.privacy.level == "none" else Accountant(
        cfg.privacy, m, fed.num_clients, list(fed.sizes), tc.batch_size, tc.local_epochs, tc.local_steps)
    epsilon = None
    chunk = tools.eval_batch
    apply = tools.apply
    store = ClientStateStore(algorithm.init_client, params, mode=cfg.engine.client_state,
                             path=writer.dir / "client_state.bin", num_clients=fed.num_clients)
    server = algorithm.init_server(params)
    uniform = algorithm.hparams.aggregation == "uniform"
    uploads = UploadStack(reuse=getattr(executor, "one_client_at_a_time", False))
    probe = probe_indices(len(fed.y_test), cfg.eval.probe_size, cfg.seed).to(device)
    # test_*, then val_* on the union of the clients' validation splits (partition.val_share)
    panel = eval_clients(fed.num_clients, cfg.eval.clients_sample, cfg.seed)  # personal models: whose
    evaluated = [("test", fed.x_test, fed.y_test)] + ([("val", fed.x_val, fed.y_val)] if len(fed.y_val) else [])

    out = LoopResult()
    totals = {"bytes_down": 0, "bytes_up": 0, "seconds": 0.0, "clients_returned": 0, "clients_dropped": 0,
              "clients_failed": 0, "clients_straggling": 0}
    best = (-1.0, 0)
    first = 1
    if resume is not None:
        assert checkpoints is not None
        server, out.history, totals, best = resume.server, resume.history, resume.totals, tuple(resume.best)
        checkpoints.load_clients(resume, store)
        if tools.teacher_memo is not None and resume.memo is not None:
            tools.teacher_memo.load(resume.memo)
        if resume.executor is not None:
            executor.restore_state(resume.executor)  # type: ignore[attr-defined]  # it saved one
        if accountant is not None:  # its rounds so far, not saved: composed again
            epsilon = accountant.step(resume.round)
        first = resume.round + 1
    bar = tqdm(total=tc.rounds, initial=first - 1, desc=algorithm.name, unit="round",
               disable=None if cfg.output.progress else True)
    t = first - 1
    try:
        for t in range(first, tc.rounds + 1):
            start = time.perf_counter()
            sampled = sampler(fed.num_clients, m, cfg.seed, t, fed.label_counts_np, retries=cfg.engine.sampling_retries)
            info = RoundInfo(round=t, num_clients=fed.num_clients, sampled=tuple(sampled))
            payload = algorithm.broadcast(server, info)
            fate = fates(cfg.engine, cfg.seed, t, sampled)
            if not fate.returning:
                raise _no_clients(t, f"all {len(sampled)} sampled clients dropped out (engine.dropout)", writer)
            jobs = [client_job(fed, k, store.get(k), cfg.train, cfg.seed, t, work=fate.work.get(k, 1.0))
                    for k in fate.returning]
            down = len(sampled) * tree_bytes(payload)  # the dropped received the broadcast too
            up = 0
            weights = _weights(fed, fate.returning, uniform)
            # the teacher table sees the broadcast payload; the pre-phase may read it. An
            # executor that builds it where the clients train does so when no pre-phase reads it.
            own = getattr(executor, "builds_teacher", False) and algorithm.client_summary is None
            round_tools = tools if own else with_teacher(tools, payload, jobs, cfg.engine.teacher_cache)
            if algorithm.client_summary is not None:
                payload, pre_down, up = _pre_phase(algorithm, round_tools, payload, jobs, weights.to(device))
                down += pre_down
            outputs, failed = train_clients(executor, round_tools, payload, jobs, t, cfg.engine.accept_failures)
            if not outputs:
                raise _no_clients(t, f"all {len(jobs)} clients that trained failed (engine.accept_failures)", writer)
            jobs = round_tools = None  # the clients' states and teacher rows: not held past training
            if failed:  # the others' weights renormalised; the aggregation sees who returned
                weights = _weights(fed, [o.client_id for o in outputs], uniform)
                info = replace(info, sampled=tuple(o.client_id for o in outputs))
            elif fate.dropped:
                info = replace(info, sampled=tuple(fate.returning))
            counts = {"clients_returned": len(outputs), "clients_dropped": len(fate.dropped),
                      "clients_failed": len(failed), "clients_straggling": len(fate.work)}
            for key, value in counts.items():
                totals[key] += value

            losses = torch.stack([o.loss.double().cpu() for o in outputs])
            bad = [o.client_id for o, ok in zip(outputs, torch.isfinite(losses)) if not ok]
            if bad:
                raise _diverged(t, f"client {bad[0]} produced a non-finite training loss", writer)
            if algorithm.init_client is not None:  # stored now: not held beside the stacked uploads
                for o in outputs:
                    store.put(o.client_id, o.state)
                    o.state = {}
            if cfg.privacy.level == "client":  # one upload, the noised mean of the clipped models
                stacked, agg_weights = private_mean([o.upload for o in outputs], payload["params"], cfg.privacy,
                                                    cfg.seed, t, algorithm.name)
            else:
                stacked, agg_weights = uploads([o.upload for o in outputs]), weights.to(device)
            server = algorithm.aggregate(server, stacked, agg_weights, info)
            if accountant is not None:
                epsilon = accountant.step()
            uploads.release_if_held(server)
            if not all_finite(server["params"]):
                raise _diverged(t, "the aggregated global model has non-finite parameters", writer)
            up += sum(tree_bytes(o.upload) for o in outputs)
            seconds = time.perf_counter() - start
            totals["bytes_down"] += down
            totals["bytes_up"] += up
            totals["seconds"] += seconds

            if t % cfg.eval.every == 0 or t == tc.rounds:
                row = {"round": t}
                predict = None
                if algorithm.predict is not None:
                    predict = partial(algorithm.predict, server, apply=apply)
                for prefix, x_eval, y_eval in evaluated:
                    if algorithm.personal:  # each panel client's own model, as the store holds it now
                        models = (store.get(k)["params"] for k in panel)  # one at a time
                        local = [fed.test_indices(k) for k in panel] if prefix == "test" else None
                        row.update(evaluate_personal(apply, models, local, x_eval, y_eval, chunk, predict, prefix))
                    else:
                        row.update(evaluate(apply, server["params"], x_eval, y_eval, chunk, predict, prefix))
                row.update(_aux_metrics(outputs, weights))
                if cfg.eval.drift:
                    local = [o.end_params for o in outputs]
                    row.update(drift_metrics(apply, payload["params"], local, fed.x_test, fed.y_test, probe, chunk))
                row.update(
                    train_loss=float((weights * losses).sum()),
                    seconds=seconds,
                    wall_seconds=totals["seconds"],
                    bytes_down=down,
                    bytes_up=up,
                    clients=len(sampled),
                    **counts,
                )
                if accountant is not None:
                    row["epsilon"] = epsilon
                writer.log(row)
                out.history.append(row)
                if on_round is not None:
                    on_round(row)
                if row["test_accuracy"] > best[0]:
                    best = (row["test_accuracy"], t)
                bar.set_postfix(acc=f"{row['test_accuracy']:.3f}", best=f"{best[0]:.3f}")
            if checkpoints is not None and checkpoints.due(t, tc.rounds):
                memo = tools.teacher_memo.dump() if tools.teacher_memo is not None else None
                state = getattr(executor, "checkpoint_state", lambda: None)()
                size = writer.sync()
                snap = Snapshot(t, server, out.history, totals, best, size,
                                prefix_sha256(writer.dir / "metrics.jsonl", size), memo, state)
                checkpoints.save(snap, store)
            bar.update(1)
            outputs = stacked = None  # this round's: not held while the next one trains
    except DivergenceError as err:
        out.summary = _summary(out, totals, best, tc.rounds, status=err.status, message=str(err))
        err.result = out  # fedrift.api writes summary.json, with the run's facts
        raise
    except KeyboardInterrupt as err:
        message = _interrupted(t, out, writer, checkpoints)
        out.summary = _summary(out, totals, best, tc.rounds, status="interrupted", message=message)
        if checkpoints is not None:
            out.summary["checkpoint_round"] = checkpoints.last_round
        err.result = out  # type: ignore[attr-defined]  # fedrift.api writes summary.json
        raise
    else:
        if cfg.eval.personalize:  # reads the client states: before the store closes
            heads = getattr(model, "head_prefixes", ("fc",))
            out.personalization = personalize(cfg, algorithm, tools, executor, server, fed, store, heads)
    finally:
        bar.close()
        store.close()  # deletes the disk file
    out.global_params = server["params"]
    out.server_state = server
    out.summary = _summary(out, totals, best, tc.rounds, status="completed")
    if accountant is not None:
        out.summary.update(epsilon=epsilon, delta=cfg.privacy.delta)
    if cfg.eval.at_rounds:
        at = {r["round"]: r["test_accuracy"] for r in out.history}
        out.summary["accuracy_at"] = {str(r): at.get(r) for r in cfg.eval.at_rounds}
    if out.personalization is not None:
        out.summary["personalized_accuracy"] = out.personalization["personalized_accuracy"]
        out.summary["global_local_accuracy"] = out.personalization["global_local_accuracy"]
    return out


def _aux_metrics(outputs: list, weights: torch.Tensor) -> dict[str, float]:
    """The p_k-weighted mean over clients of each scalar the local losses reported."""
    keys = sorted({k for o in outputs for k in o.aux})
    out = {}
    for k in keys:
        vals = torch.stack([o.aux[k].double().cpu() if k in o.aux else torch.tensor(float("nan")) for o in outputs])
        out[k] = float((weights.cpu() * vals).sum())
    return out


def _pre_phase(algorithm: Algorithm, tools: RoundTools, payload: dict, jobs: list[ClientJob], weights: torch.Tensor):
    """Clients summarise (e.g. class prototypes); the server combines, with the round's
    aggregation weights; the result goes down."""
    with torch.no_grad():
        summaries = [algorithm.client_summary(payload, j.ctx, tools.client_data(j, payload), tools.apply) for j in jobs]
    up = sum(tree_bytes(s) for s in summaries)
    extra = algorithm.pre_combine(payload, stack(summaries), weights)
    return {**payload, **extra}, len(jobs) * tree_bytes(extra), up


def _weights(fed: Federation, clients: list[int], uniform: bool) -> torch.Tensor:
    """Aggregation weights over the clients that return: p_k by samples, or uniform."""
    n = torch.tensor([float(fed.sizes[k]) for k in clients], dtype=torch.float64)
    return torch.full_like(n, 1.0 / len(n)) if uniform else n / n.sum()


def _no_clients(t: int, what: str, writer: RunWriter) -> NoClientsError:
    return NoClientsError(
        f"round {t}: no client returned ({what}); the run stopped and the metrics of earlier "
        f"rounds are kept in {writer.dir / 'metrics.jsonl'}"
    )


def _diverged(t: int, what: str, writer: RunWriter) -> DivergenceError:
    return DivergenceError(
        f"training diverged in round {t}: {what}; the run stopped and the metrics of earlier "
        f"rounds are kept in {writer.dir / 'metrics.jsonl'} (try a lower train.lr or set train.clip_grad_norm)"
    )


def _interrupted(t: int, out: LoopResult, writer: RunWriter, checkpoints: Checkpointer | None) -> str:
    done = int(out.history[-1]["round"]) if out.history else 0
    where = f"; it continues from the checkpoint of round {checkpoints.last_round}" if checkpoints and checkpoints.last_round else (
        "; it starts again from round 1 (no checkpoint yet)")
    return (
        f"interrupted in round {t} (metrics up to round {done} kept in {writer.dir / 'metrics.jsonl'}); "
        f"continue with: fedrift run --resume {writer.dir}{where}"
    )


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
        "bytes_down_total": totals["bytes_down"],
        "bytes_up_total": totals["bytes_up"],
        **{f"{k}_total": totals[k] for k in ("clients_returned", "clients_dropped", "clients_failed", "clients_straggling")},
    }
    if "local_accuracy" in last:  # personal models (FedProto): on the clients' own splits
        summary["final_local_accuracy"] = last["local_accuracy"]
    if message:
        summary["message"] = message
    return summary

