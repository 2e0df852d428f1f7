"""Clients spread over Ray actors, on a local Ray or an existing cluster (``engine.ray_address``).

The same design as the ``processes`` executor, with Ray doing the transport: each actor
(one CPU, one torch thread) rebuilds the run's training tools once from the validated config
and the run's prepared data, which go into Ray's object store once (so a node without the
data files gets them from there, never per round). Per round the payload is put once and
shared by every actor; each actor trains its share of the clients (``split_jobs``, a pure
function of the jobs) with the sequential executor's code and returns their outputs, which
come back in job order. So results equal one-thread ``sequential`` bit for bit, as
``processes`` does, client state and pre-phases included (both stay with the server).

Actors outlive their run for ``KEEP_SECONDS`` when the cluster is not the run's own (an
``engine.ray_address``): the next run of this driver on that cluster takes them and rebuilds
its tools in them, which costs milliseconds where a new actor's process costs seconds (Python,
torch and fedrift imported: about 3 s of a core each here). Unused for ``KEEP_SECONDS``, they
are killed, so that an idle driver does not hold a shared cluster's CPUs.

An actor that dies mid-round (its node lost, its process killed) has its clients trained again
on another actor: the first one free, a survivor or the replacement asked for at once. Their
work is a pure function of the payload and their jobs, so the round's result does not change;
one line says so. When no actor survives and Ray places no replacement within
``REPLACE_SECONDS`` (the lost node was the only one with a free CPU), the run stops as after a
lost head (below); so it does when more than ``RETRIES`` actors are lost in a round.

A lost head node (its machine gone, its processes killed) takes the cluster with it: no actor
can be made and Ray's own core would wait 60 s for it, then end the driver with a C++ log
line. So while a round trains the driver checks every ``PROBE_SECONDS`` that the head still
takes connections, and before each round and before it makes actors (Ray's own wait is made
``GCS_WAIT``); ``LOST_AFTER`` failed checks in a row raise
:class:`ClusterLostError`: the run stops as at Ctrl-C (``interrupted`` in ``summary.json``,
its checkpoint kept, one line naming ``fedrift run --resume``), and a resume may name another
head or an executor with equal results (``engine/checkpoint.py``).

No wait is silent. An address is checked before ``ray.init`` (:func:`check_head`): nothing
listening, another service on the port (a plain TCP server, an HTTP server, another gRPC
server such as Ray Client's) or a cluster refusing this driver's token is one line within
``HEAD_SECONDS``, where ``ray.init`` would retry for minutes, printing Ray's own GCS errors.
More ``engine.workers`` than the cluster has CPUs are lowered to its CPUs with a line (one
actor a CPU); while actors wait for CPUs that other jobs hold, a line every ``SAY_EVERY``
seconds says what they wait for.

A local Ray (no ``engine.ray_address``) listens on loopback only (:func:`loopback_only`): a
Ray node runs whatever code reaches it, and Ray's default on Linux is every interface. A
cluster the user starts is theirs to place on a trusted network (docs/tutorials/ray-cluster.md).

Ray is an optional extra (``pip install 'fedrift[ray]'``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from fedrift.config import Config
from fedrift.engine.build import client_tools, prepare
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.engine.executors.worker import (
    BUILD_TEACHER, available_cpus, portable, round_tools, same_run, split_jobs, teacher_rows, tools_fingerprint,
    workers_build_teacher,
)
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.errors import ClusterLostError, ConfigError

log = logging.getLogger("fedrift")

RETRIES = 3  # actors lost per round before the round fails
PROBE_SECONDS = 1.0  # while a round trains: how often the driver checks that the head node answers
LOST_AFTER = 3  # failed checks in a row that mean the head is lost (one refused connection may be a blip)
HEAD_SECONDS = 5.0  # how long check_head waits for the address to answer as a Ray head node does
REPLACE_SECONDS = 30.0  # with every actor of a round lost: how long a replacement may take to be placed
SAY_EVERY = 30.0  # while actors wait for CPUs: seconds between the lines that say so
TOKEN_SOURCES = "RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"
# Ray's own wait for a lost head (60 s), after which its core ends the driver with a C++ log line
# even while the driver does nothing with Ray (the server evaluating): 10 minutes, so that the
# check at the next round start says what happened first (an evaluation of up to 10 minutes).
# Read once, by ray.init, which is reached only once check_head found a head node answering
# (Ray's wait for one that never answers was this long too: an hour, before). A user's value stays.
GCS_WAIT = ("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
# Ray's single-machine mode (its default on Windows and macOS): the node's address is 127.0.0.1,
# and a node whose address is 127.0.0.1 binds its servers (GCS, raylet, object manager, agents)
# to it; otherwise they bind to every interface. Ray 2.60 turns a 127.0.0.1 given to ray.init
# (``_node_ip_address``) into the machine's outside address (services.resolve_ip_for_localhost),
# so this switch is the way: read by each Ray process as it imports ray (the local Ray's
# processes, started by ray.init, inherit it) and, in this driver, by get_node_ip_address through
# ray_constants.ENABLE_RAY_CLUSTER, which loopback_only sets meanwhile.
LOOPBACK_ONLY = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
KEEP_SECONDS = 30.0  # how long a finished run's actors wait for the next run of this driver (0: killed at once)
_KEPT: dict[str, list[tuple[Any, object]]] = {}  # a cluster's GCS address -> (actor, its stay's token)
_KEPT_LOCK = threading.Lock()
_JOINED: dict[str, str] = {}  # "address": the cluster this process's Ray connection joined (a run's engine.ray_address)


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("engine.executor: ray needs the ray package; install it with pip install 'fedrift[ray]'") from None
    return ray


@contextmanager
def loopback_only() -> Iterator[None]:
    """While a local Ray starts (``ray.init`` without an address): every Ray process it starts
    listens on 127.0.0.1 only (``LOOPBACK_ONLY``; checked against /proc/net/tcp on Linux with
    Ray 2.60: the same is to be checked again when Ray is upgraded). Restored afterwards, so
    that a later run of this process can join a cluster on other machines."""
    from ray._private import ray_constants

    name, value = LOOPBACK_ONLY
    known = hasattr(ray_constants, "ENABLE_RAY_CLUSTER")  # a Ray without it: the variable alone
    saved_env, saved = os.environ.get(name), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[name] = value
    if known:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if known:
            ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env


def host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``[ray://]HOST:PORT`` (config.py has checked its form)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


ALLOWED = "allowed: HOST:PORT of a running head node's GCS (ray start --head prints it; port 6379 by default), or null for a local Ray"


def _answers(address: str) -> bool:
    """Whether anything takes connections at ``host:port`` (a head node's GCS)."""
    try:
        with socket.create_connection(host_port(address), timeout=2):
            return True
    except OSError:
        return False


def check_head(address: str) -> None:
    """Refuse at once, in one line, an address where no Ray head node answers, naming what
    answers instead: nothing (connection refused), a service that is not Ray's GCS (a TCP
    server that says nothing, an HTTP server, another gRPC service such as Ray Client's
    server), or a cluster that refuses this driver's token (token authentication off here,
    no token found, or another token than the cluster's). One call the head answers before
    anything else (its cluster id), with the token ``ray.init`` would send, bounded by
    ``HEAD_SECONDS``: ``ray.init`` would retry for minutes, printing Ray's GCS errors."""
    try:
        with socket.create_connection(host_port(address), timeout=HEAD_SECONDS):
            pass
    except OSError as err:
        raise ConfigError(f"engine.ray_address: no Ray head node answers at {address!r} ({err}); {ALLOWED}") from None
    if address.startswith("ray://"):  # Ray Client: a handshake of its own
        return
    import grpc
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    from ray.exceptions import AuthenticationError

    token_mode = get_authentication_mode() == AuthenticationMode.TOKEN
    loader = AuthenticationTokenLoader.instance()
    try:
        has_token = token_mode and loader.has_token()
    except AuthenticationError:  # token mode, and no token anywhere
        has_token = False
    metadata = tuple((k.lower(), v) for k, v in loader.get_token_for_http_header().items()) if has_token else ()
    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=HEAD_SECONDS, metadata=metadata)
            return
        except grpc.RpcError as err:
            code, details = err.code(), " ".join(str(err.details() or "").split())
    if code != grpc.StatusCode.UNAUTHENTICATED:
        what = {grpc.StatusCode.DEADLINE_EXCEEDED: f"a service that does not speak gRPC answers there (no reply in {HEAD_SECONDS:g} s)",
                grpc.StatusCode.UNIMPLEMENTED: "a gRPC service that is not Ray's GCS answers there (Ray Client's server port? "
                                               "give the GCS port, or ray://HOST:PORT for Ray Client)"}
        said = what.get(code, f"a service that is not Ray's GCS answers there ({code.name}: {details[:160]})")
        raise ConfigError(f"engine.ray_address: {address!r} is not a Ray head node: {said}; {ALLOWED}")
    where = f"engine.ray_address: the Ray cluster at {address!r}"
    if not token_mode:
        raise ConfigError(f"{where} requires a token and this driver sends none (token authentication is off here: "
                          f"RAY_AUTH_MODE is not token); allowed: RAY_AUTH_MODE=token and the cluster's token in {TOKEN_SOURCES}")
    if not has_token:
        raise ConfigError(f"{where} requires a token and none is set here (RAY_AUTH_MODE=token, but no token in "
                          f"{TOKEN_SOURCES}); allowed: the token the cluster's head node was started with, in one of them")
    source = ("RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else
              f"RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}" if os.environ.get("RAY_AUTH_TOKEN_PATH")
              else "~/.ray/auth_token")
    raise ConfigError(f"{where} refused this driver's token (from {source}): it is not the cluster's; allowed: "
                      f"the token the cluster's head node was started with, in {TOKEN_SOURCES}")


class _ClientActor:
    """One actor: the run's tools, built once; trains the clients it is sent."""

    def __init__(self, prepared: Any) -> None:
        torch.set_num_threads(1)
        self.tools: RoundTools | None = client_tools(prepared)
        self.sequential = SequentialExecutor()

    def rebuild(self, prepared: Any) -> tuple[int, str, dict[str, Any]]:
        """Another run's tools in this process (kept from an earlier run of the driver)."""
        self.tools = client_tools(prepared)
        return self.ready()

    def release(self) -> None:
        """Drop the finished run's tools (its data) while the actor waits for another run."""
        self.tools = None

    def ready(self) -> tuple[int, str, dict[str, Any]]:
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id(), tools_fingerprint(self.tools)

    def train(self, round_: int, lr: float | None, jobs: list[ClientJob], payload: dict[str, Any], teacher: Any) -> list[ClientOutput]:
        tools = round_tools(self.tools, lr, payload, jobs, teacher)  # at the parent's tools' lr, with the teacher rows
        return [portable(o) for o in self.sequential.run_round(tools, payload, jobs, round_)]


class RayExecutor:
    """Clients spread over ``engine.workers`` Ray actors (default: the cluster's CPUs)."""

    builds_teacher = True  # as processes: each actor builds its clients' teacher rows
    one_client_at_a_time = True

    def __init__(self, cfg: Config) -> None:
        self.ray = require_ray()
        if cfg.engine.ray_address and not (self.ray.is_initialized() and _JOINED.get("address") == cfg.engine.ray_address):
            check_head(cfg.engine.ray_address)  # refused before the run folder is made
        self.cfg = cfg
        self.workers = cfg.engine.workers
        self._prepared: Any = None
        self._actors: list[Any] = []
        self._started_ray = False
        self._tools: RoundTools | None = None
        self._expect: dict[str, Any] = {}
        self._local = SequentialExecutor()
        self._cache = cfg.engine.teacher_cache
        self.nodes: set[str] = set()  # the cluster nodes the actors ran on
        self.replaced = 0  # actors lost and replaced so far
        self._gcs = ""  # the head node's address, checked while rounds train (_check_head)
        self._round = 0
        self._lost = False  # the cluster went away: nothing more is asked of it
        self._misses = 0  # checks in a row that found no head
        self._coming: list[tuple[Any, Any]] = []  # replacements asked for, not yet ready: (actor, its ready ref)
        self._device = "cpu"  # where the run's server works (a resume without Ray needs the cpu)

    def use_prepared(self, prepared: Any) -> None:
        """The run's prepared data (``fedrift.api`` hands it over): what actors build from."""
        self._prepared = prepared

    # -- the contract ------------------------------------------------------------------

    def run_round(self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int) -> list[ClientOutput]:
        if not jobs:
            return []
        if self._tools is None:
            self._tools, self._expect = tools, tools_fingerprint(tools)
        if not same_run(tools, self._tools):  # tools the actors do not hold (personalisation)
            return self._local.run_round(tools, payload, jobs, round_)
        ray = self.ray
        self._round, self._device = round_, tools.x.device.type
        if self._actors:  # the head lost between rounds: put would end this process
            self._check_head(at_once=True)
        self._start()
        teacher = BUILD_TEACHER if workers_build_teacher(tools, self._cache) else None
        buckets = split_jobs(jobs, min(len(self._actors), len(jobs)))
        payload_ref = ray.put(portable(payload))
        work = []
        for b, bucket in enumerate(buckets):
            mine = [portable(jobs[i]) for i in bucket]
            work.append((mine, teacher or teacher_rows(tools, mine)))
        results = self._train_all(round_, tools.lr, work, payload_ref)
        out: list[ClientOutput | None] = [None] * len(jobs)
        device = tools.x.device
        for b, bucket in enumerate(buckets):
            for i, o in zip(bucket, results[b]):
                out[i] = o if device.type == "cpu" else portable(o, device)
        return out  # type: ignore[return-value]

    def _train_all(self, round_: int, lr: float | None, work: list[tuple[Any, Any]], payload_ref: Any) -> dict[int, list[ClientOutput]]:
        """Bucket ``b`` of ``work`` trained on actor ``b``; the outputs by bucket. A bucket whose
        actor is lost goes to the first actor free: a survivor done with its own bucket, or the
        replacement asked for at once (:meth:`_lost_actor`)."""
        ray = self.ray
        running = {self._actors[b].train.remote(round_, lr, mine, payload_ref, part): (b, self._actors[b])
                   for b, (mine, part) in enumerate(work)}
        results: dict[int, list[ClientOutput]] = {}
        idle: list[Any] = []
        todo: list[int] = []  # buckets whose actor was lost
        lost = 0
        alone_since: float | None = None  # since when lost buckets wait with no actor left
        while running or todo:
            while todo and idle:
                b, actor = todo.pop(0), idle.pop(0)
                mine, part = work[b]
                running[actor.train.remote(round_, lr, mine, payload_ref, part)] = (b, actor)
            coming = {ref: actor for actor, ref in self._coming}
            refs = [*running, *coming]
            done = ray.wait(refs, num_returns=1, timeout=PROBE_SECONDS)[0] if refs else []
            if not done:
                self._check_head()
                if todo and not running:  # every actor lost: only a replacement can train them
                    alone_since = alone_since or time.monotonic()
                    if time.monotonic() - alone_since > REPLACE_SECONDS:
                        self._lost = True
                        raise ClusterLostError(
                            f"engine.ray_address: the Ray cluster at {self._gcs!r} lost every actor of round {round_} "
                            f"and placed none anew within {REPLACE_SECONDS:g} s (their nodes gone, no CPU free elsewhere)",
                            hint=self._resume_hint())
                continue
            ref = done[0]
            if ref in coming:
                self._coming = [(a, r) for a, r in self._coming if r is not ref]
                try:
                    self._admit(ray.get(ref))
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                    continue  # lost before it was ready: the next loss asks again
                self._actors.append(coming[ref])
                idle.append(coming[ref])
                alone_since = None
                continue
            b, actor = running.pop(ref)
            try:
                results[b] = ray.get(ref)
                idle.append(actor)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as err:
                self._check_head(at_once=True)  # a lost head takes its node's actors with it
                lost += 1
                if lost > RETRIES:  # nodes failing one after another: stop as after a lost head, resumable
                    self._lost = True
                    raise ClusterLostError(
                        f"engine.ray_address: the Ray cluster at {self._gcs!r} lost {lost} actors in round {round_} "
                        f"(more than {RETRIES}; last: {type(err).__name__})", hint=self._resume_hint()) from None
                self._lost_actor(actor, round_, len(work[b][0]))
                todo.append(b)
        return results

    def _lost_actor(self, actor: Any, round_: int, clients: int) -> None:
        """An actor lost mid-round: out of the pool, a replacement asked for (not waited for)."""
        self._actors = [a for a in self._actors if a is not actor]
        new = self._ask_actors(1)[0]
        self._coming.append((new, new.ready.remote()))
        self.replaced += 1
        log.warning(f"ray executor: round {round_}: an actor was lost (its process or its node gone); its {clients} "
                    f"client(s) train again on the first actor free, a replacement is asked for "
                    f"({len(self._actors)} actor(s) left on the Ray cluster at {self._gcs})")

    def _resume_hint(self) -> str:
        same = self.cfg.engine.threads == 1 and self._device == "cpu"  # engine/checkpoint.py EQUAL_EXECUTORS
        return ("; on another cluster: add engine.ray_address=HOST:PORT"
                + ("; without Ray: add engine.executor=sequential engine.ray_address=null (the same results with "
                   "engine.threads=1)" if same else ""))

    def close(self) -> None:
        if not self._lost:  # replacements not placed yet: they would hold a CPU once placed
            _kill(self.ray, [a for a, _ in self._coming])
        self._coming = []
        if self._lost:  # asking a lost cluster to kill its actors would wait for its head
            self._actors = []
            with _KEPT_LOCK:
                _KEPT.pop(self._gcs, None)
            if self.ray.is_initialized():
                self.ray.shutdown()  # a later run in this process may join another cluster
            self._started_ray = False
            return
        if self._actors and not self._started_ray and self.ray.is_initialized() and KEEP_SECONDS > 0:
            _keep(self.ray, self._gcs, self._actors)  # for the next run on this cluster
        else:
            _kill(self.ray, self._actors)
        self._actors = []
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self._started_ray = False

    # -- a lost head -------------------------------------------------------------------

    def _wait(self, refs: list[Any], actors: bool = False) -> None:
        """Until ``refs`` are ready (or failed), checking the head every ``PROBE_SECONDS``;
        for new ``actors``, a line every ``SAY_EVERY`` seconds while some are not placed."""
        start = said = time.monotonic()
        while True:
            ready = self.ray.wait(refs, num_returns=len(refs), timeout=PROBE_SECONDS)[0]
            if len(ready) == len(refs):
                return
            self._check_head()
            if actors and time.monotonic() - said >= SAY_EVERY:
                said = time.monotonic()
                free = self.ray.available_resources().get("CPU", 0.0)
                total = self.ray.cluster_resources().get("CPU", 0.0)
                log.warning(f"ray executor: waiting {said - start:.0f} s for {len(refs) - len(ready)} of {len(refs)} "
                            f"actor(s) to start on the Ray cluster at {self._gcs} (1 CPU each; {free:g} of {total:g} "
                            "CPUs free: an actor starts once Ray has a CPU for it); Ctrl-C stops the run")

    def _check_head(self, at_once: bool = False) -> None:
        """Raise :class:`ClusterLostError` when the head node no longer takes connections:
        ``LOST_AFTER`` checks in a row, ``PROBE_SECONDS`` apart (``at_once``: now, in a row;
        else one check a call, counted across calls)."""
        if not self._gcs:
            return
        for _ in range(LOST_AFTER if at_once else 1):
            if _answers(self._gcs):
                self._misses = 0
                return
            self._misses += 1
            if self._misses >= LOST_AFTER:
                break
            if at_once:
                time.sleep(PROBE_SECONDS)
        if self._misses < LOST_AFTER:
            return
        self._lost = True
        raise ClusterLostError(
            f"engine.ray_address: the Ray cluster at {self._gcs!r} was lost in round {self._round}: its head node stopped answering",
            hint=self._resume_hint())

    # -- actors ------------------------------------------------------------------------

    def _start(self) -> None:
        ray = self.ray
        address = self.cfg.engine.ray_address
        if ray.is_initialized() and address and _JOINED.get("address") not in (None, address):
            ray.shutdown()  # joined another cluster for an earlier run: this run names its own
        if not ray.is_initialized():
            _JOINED.pop("address", None)
            with _KEPT_LOCK:
                _KEPT.clear()  # actors of an earlier connection: gone with it
            if address:
                check_head(address)
            longer = bool(address) and GCS_WAIT[0] not in os.environ  # a local Ray's processes would inherit it
            if longer:
                os.environ[GCS_WAIT[0]] = GCS_WAIT[1]
            try:
                # "local": a Ray of the run's own even when a cluster started with `ray start` runs on
                # this machine (a bare init joins that one, and refuses num_cpus with a traceback);
                # it listens on loopback only
                if address:
                    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
                else:
                    with loopback_only():
                        ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False,
                                 num_cpus=self.workers or available_cpus())
            except ConnectionError as err:
                raise ConfigError(f"engine.ray_address: no Ray cluster at {address!r} ({err}); allowed: the "
                                  "address of a running head node (ray start --head), or null for a local Ray") from None
            finally:
                if longer:
                    os.environ.pop(GCS_WAIT[0], None)
            self._started_ray = not address  # a cluster's connection stays for the next run
            if address:
                _JOINED["address"] = address
        if not self._gcs:  # the address given (a Ray Client's server, for ray://), or the local Ray's head
            self._gcs = self.cfg.engine.ray_address or ray.get_runtime_context().gcs_address
        if self._actors:
            return
        if self._prepared is None:  # not given by the API: load it as the run did
            self._prepared = prepare(self.cfg)
        self._prepared_ref = ray.put(self._prepared)
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise ConfigError(f"engine.ray_address: the Ray cluster at {self._gcs} has no CPUs for actors (one CPU each); "
                              "allowed: a cluster whose nodes offer CPUs (ray start --num-cpus=N)")
        n = self.workers or cpus
        if n > cpus:  # more would wait for CPUs forever (a local Ray is started with engine.workers CPUs)
            log.warning(f"engine.workers: {n} actors asked for, and the Ray cluster at {self._gcs} has {cpus} CPUs "
                        f"(one an actor): {cpus} actors train the clients (the results do not change)")
            n = cpus
        self._actors = self._kept_actors(n)
        self._actors += self._new_actors(n - len(self._actors))

    def _kept_actors(self, n: int) -> list[Any]:
        """Up to ``n`` actors an earlier run of this driver left on this cluster, rebuilt for
        this run; one that died meanwhile is dropped (``_new_actors`` makes up the number)."""
        with _KEPT_LOCK:
            kept = _KEPT.get(self._gcs, [])
            taken, kept[:] = [a for a, _ in kept[:n]], kept[n:]
        alive = []
        for actor in taken:
            ready = actor.rebuild.remote(self._prepared_ref)
            self._wait([ready])
            try:
                self._admit(self.ray.get(ready))
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError):
                continue
            alive.append(actor)
        return alive

    def _new_actors(self, n: int) -> list[Any]:
        if n <= 0:
            return []
        actors = self._ask_actors(n)
        ready = [a.ready.remote() for a in actors]
        self._wait(ready, actors=True)
        for answer in self.ray.get(ready):
            self._admit(answer)
        return actors

    def _ask_actors(self, n: int) -> list[Any]:
        """``n`` new actors asked of the cluster (placed and built by Ray meanwhile)."""
        self._check_head(at_once=True)  # making an actor without a head would wait for it
        cls = self.ray.remote(num_cpus=1, max_restarts=0)(_ClientActor)
        return [cls.remote(self._prepared_ref) for _ in range(n)]

    def _admit(self, answer: tuple[int, str, dict[str, Any]]) -> None:
        """An actor's ``ready`` answer: its node noted, its tools checked against the run's."""
        _, node, found = answer
        self.nodes.add(node)
        for what, value in self._expect.items():
            if found[what] != value:
                raise ConfigError(f"engine.executor: ray actors rebuilt a different {what} ({found[what]}) "
                                  f"than this run's ({value}); allowed: sequential or batched")

    def actor_pids(self) -> list[int]:
        """The actors' process ids (for tests that kill one)."""
        return [pid for pid, _, _ in self.ray.get([a.ready.remote() for a in self._actors])]


def _kill(ray: Any, actors: list[Any]) -> None:
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # already gone with its node
            pass


def _keep(ray: Any, gcs: str, actors: list[Any]) -> None:
    """Keep a finished run's actors for the next run on the cluster at ``gcs``, their tools
    dropped; killed after ``KEEP_SECONDS`` unless a run has taken them by then (a run that
    takes and leaves them again starts their wait anew: each stay has a token of its own)."""
    token = object()
    for actor in actors:
        actor.release.remote()
    with _KEPT_LOCK:
        _KEPT.setdefault(gcs, []).extend((actor, token) for actor in actors)

    def expire() -> None:
        with _KEPT_LOCK:
            kept = _KEPT.get(gcs, [])
            stale = [a for a, t in kept if t is token]
            kept[:] = [(a, t) for a, t in kept if t is not token]
        if stale and ray.is_initialized():
            _kill(ray, stale)

    timer = threading.Timer(KEEP_SECONDS, expire)
    timer.daemon = True
    timer.start()
