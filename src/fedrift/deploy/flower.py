"""fedrift's server half as a Flower ServerApp, its client half as a Flower ClientApp.

The ServerApp (on the SuperLink's machine) is :class:`fedrift.engine.server.Server` with
Flower as the transport: it asks every SuperNode which fedrift client it serves (node config
``partition-id``), then each round sends the sampled clients' SuperNodes the broadcast
payload (a ``train`` message; the pre-phase, when the algorithm has one, is a
``train.summary`` message round first), aggregates the replies, evaluates and logs as
``fedrift run`` does, into ``output.dir`` on that machine. ``bytes_down``/``bytes_up`` are
the Flower messages' sizes: the bytes of the objects Flower ships for them.

The ClientApp (on each SuperNode) rebuilds the run from the same config, reading the dataset
from its own ``data-root`` (node config; default ``data.root``), and trains its client with
:func:`fedrift.engine.client.train_client` on the batch schedule it derives itself (a pure
function of seed, round and client). A stateful algorithm's client state (SCAFFOLD's
control, FedDyn's gradient, MOON's previous model) stays on the device, in Flower's
``context.state``; the server keeps none. A BatchNorm model's running statistics are part of
every model state (``models/norm.py``), so they travel in the payload and uploads and stay in
the devices' states like the parameters.

Failures end legibly: a device that cannot be reached (its SuperNode stopped: the
SuperLink's own error reply, matched to the client by the message it answers), whose
ClientApp crashes, or that does not reply within ``reply-seconds`` is a client failure, left
out under ``engine.accept_failures`` and counted, else the run stops (status ``failed``, the
model so far kept, the failed clients counted in ``clients_failed_total``). A fedrift error on
a device (its node config, its data) comes back as such and stops the run as a config error
naming the node; among them a device whose client's data fingerprint (``fedrift.data.
fingerprint``) differs from the one the app recorded where it was built (rows permuted, another
version of the files), unless ``data.accept_changed``. The ServerApp's log (``flwr run
--stream``, ``flwr log``) has a line per round, a line a minute naming the clients a round
still waits on, one ``fedrift: error:`` line on failure, and the run folder (absolute: a
relative ``output.dir`` is the ServerApp's working folder's); ``flwr ls`` shows the run
failed, since Flower's exit code does not. Flower marks a run failed only when its ServerApp
raises, and logs every such exception with its traceback and an exit-code paragraph: both are
left out of the run's log by a filter on Flower's logger (:func:`_last_words`), so that the
log ends with fedrift's lines.

Importing this module needs ``flwr`` (the ``flower`` extra).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Mapping

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedrift.deploy.project import (AGAIN, RESUBMIT, FINGERPRINTS_KEY, INSTALL, MARKER, NODE_CLIENT, NODE_ROOT,
                                    OVERRIDES_KEY, REPLY_KEY, WAIT_KEY, check_deployable, submitted_config)
from fedrift.errors import ConfigError, FedriftError

if TYPE_CHECKING:  # torch is imported where used: a SuperNode answering who it serves loads none
    import torch

log = logging.getLogger("fedrift")

SEP = "/"  # joins a tree's keys into one record key
WHO = "query.fedrift"  # which client does this SuperNode serve?
SUMMARY = "train.summary"  # the pre-phase
TRAIN = "train"


# ------------------------------------------------------------------------------ records


def encode(tree: Mapping[str, Any], name: str) -> RecordDict:
    """A tree (nested dicts of tensors and scalars) as records ``name`` (its tensors, bit for
    bit) and ``name/meta`` (its scalars and its shape: key order, empty dicts)."""
    import torch

    tensors: OrderedDict[str, torch.Tensor] = OrderedDict()
    meta: dict[str, Any] = {}
    order: list[str] = []

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        if not node:
            order.append("e:" + prefix)
        for key, value in node.items():
            if SEP in key:
                raise FedriftError(f"{name}: key {key!r} holds {SEP!r}, which a Flower record key cannot carry")
            path = prefix + key
            if isinstance(value, Mapping):
                walk(value, path + SEP)
            elif isinstance(value, torch.Tensor):
                tensors[path] = value.detach().cpu()
                order.append("t:" + path)
            elif isinstance(value, (bool, int, float, str)):
                meta["s:" + path] = value
                order.append("s:" + path)
            else:
                raise FedriftError(f"{name}: {path} is a {type(value).__name__}, which a Flower message cannot carry")

    walk(tree, "")
    meta["order"] = order
    return RecordDict({name: ArrayRecord(tensors), f"{name}{SEP}meta": ConfigRecord(meta)})


def decode(records: RecordDict, name: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The tree :func:`encode` wrote as ``name``, its tensors on ``device``."""
    tensors = records[name].to_torch_state_dict() if name in records else {}
    meta = records[f"{name}{SEP}meta"]
    out: dict[str, Any] = {}
    for item in meta["order"]:
        kind, path = item[:2], item[2:]
        keys = path.split(SEP)
        node = out
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        if kind == "e:":
            if keys[-1]:
                node.setdefault(keys[-1], {})
        elif kind == "t:":
            node[keys[-1]] = tensors[path].to(device)
        else:
            node[keys[-1]] = meta[item]
    return out


def message_bytes(msg: Message) -> int:
    """The bytes Flower ships for a message: its objects (the message, its records, their
    arrays) as serialised, each object once."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())


def merged(*parts: RecordDict) -> RecordDict:
    out = RecordDict()
    for part in parts:
        for key, value in part.items():
            out[key] = value
    return out


# ------------------------------------------------------------------------------ server


server_app = ServerApp()


class DeviceError(FedriftError):
    """A device failed (its SuperNode unreachable or gone, its ClientApp crashed, no reply in
    time) and ``engine.accept_failures`` is off: the deployed run stops there. ``clients``: the
    round's clients that failed (counted in ``clients_failed_total``)."""

    status = "failed"

    def __init__(self, message: str, clients: list[int]) -> None:
        super().__init__(message)
        self.clients = clients


class DeployedRunFailed(Exception):
    """What the ServerApp raises to Flower once the run folder says how the run ended (so that
    ``flwr ls`` shows the run as failed): the fedrift error's one line."""


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    try:
        try:
            doc = submitted_config(context.run_config)
        except FedriftError as err:
            say(f"error: {err}")
            raise
        serve(grid, doc, float(context.run_config.get(WAIT_KEY, 600.0)), float(context.run_config.get(REPLY_KEY, 3600.0)),
              run_id=context.run_id)
    except FedriftError as err:  # already said in one line and in summary.json; Flower's status: failed
        logging.getLogger("flwr").addFilter(_last_words)
        raise DeployedRunFailed(str(err)) from None


def _last_words(record: logging.LogRecord) -> bool:
    """Flower's log lines for a run that fedrift has ended legibly, left out of the run's log:
    the traceback of :class:`DeployedRunFailed` and the exit-code paragraph after it (Flower
    logs every exception a ServerApp raises with its traceback, and raising one is the only
    way to mark the run failed in ``flwr ls``), so that the log ends with fedrift's lines."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, DeployedRunFailed):
        return False
    return not str(record.msg).startswith("Exit Code: ")


def say(line: str) -> None:
    """A line in the ServerApp's log, which ``flwr run --stream`` and ``flwr log`` show."""
    print(f"fedrift: {line}", flush=True)


def serve(grid: Grid, doc: dict[str, Any], wait: float, reply_timeout: float, run_id: int | None = None) -> dict[str, Any]:
    """The deployed run of config ``doc`` through ``grid``; its summary (also in the run folder).

    Every ending is legible: a progress line per round in the ServerApp's log, and on a
    failure one ``fedrift: error:`` line, ``summary.json`` with the status (``failed``: a
    device failed without ``engine.accept_failures``; ``config_error``: a device's or the
    federation's set-up is wrong; ``diverged``, ``no_clients`` as in a simulation) and the
    global model of the last round that finished; then the error is raised again."""
    import torch

    from fedrift.engine.build import build_run, final_state, prepare, resolved_yaml, run_facts, run_folder
    from fedrift.engine.federation import Federation
    from fedrift.engine.outputs import RunWriter
    from fedrift.engine.server import Server

    try:
        prep = prepare(doc)
        cfg = prep.config
        model, algorithm = build_run(prep)
        check_deployable(cfg, algorithm)
    except FedriftError as err:  # the server's copy of the data, or the config: before any run folder
        say(f"error: {err}")
        raise
    if cfg.engine.threads is not None:
        torch.set_num_threads(cfg.engine.threads)
    try:  # a relative output.dir is relative to the ServerApp's working folder: resolved, and said absolute
        writer = RunWriter(run_folder(cfg).absolute(), cfg.output.overwrite)
    except ConfigError as err:  # a folder that holds a run: resubmitted without an overwrite or a new folder
        said = ConfigError(str(err) if RESUBMIT in str(err) else f"{err}; in a deployment: {RESUBMIT}")
        say(f"error: {said}")
        raise said from None
    facts = {**run_facts(prep, model, "flower"), "threads": torch.get_num_threads()}
    server = None
    try:
        writer.write_text(MARKER, json.dumps({"flower_run_id": run_id, "continue": AGAIN}, indent=1) + "\n")
        writer.write_text("config.yaml", resolved_yaml(prep))
        writer.write_partition(prep.partition)
        fed = Federation(prep.dataset, prep.partition, prep.device)
        say(f"run folder {writer.dir} on the ServerApp's machine; waiting for the SuperNodes of "
            f"{fed.num_clients} clients (up to {wait:g} s)")
        start = time.perf_counter()
        try:
            nodes = discover(grid, fed.num_clients, wait)
            facts["connect_seconds"] = time.perf_counter() - start
            server = Server(cfg, fed, model, algorithm, writer, clients_build_teacher=True, prephase_on_clients=True)
            try:
                for t in server.rounds():
                    run_round(server, grid, nodes, t, reply_timeout, cfg.engine.accept_failures, prep.device)
                diverged_run = server.diverged_in_effect()
                if diverged_run is not None:
                    raise diverged_run
            finally:
                server.release()
        except FedriftError as err:
            status = getattr(err, "status", "config_error" if isinstance(err, ConfigError) else "failed")
            summary = {**(server.result(status, str(err)).summary if server else {"status": status, "message": str(err)}),
                       **facts}
            if isinstance(err, DeviceError):  # the round it stopped in was never closed: its failures counted here
                summary["clients_failed_total"] = summary.get("clients_failed_total", 0) + len(err.clients)
            done = summary.get("rounds", 0)
            if server is not None and done and status != "diverged" and cfg.output.save_model:
                writer.save_model(final_state(server.state["params"], model))  # the model after the last round that finished
            writer.write_summary(summary)
            kept = ", final_model.pt: the model after that round" if (writer.dir / "final_model.pt").exists() else ""
            say(f"error: {err}")
            say(f"{status} after {done} of {cfg.train.rounds} rounds; run folder {writer.dir} (summary.json{kept})")
            raise
        result = server.result()
        summary = {**result.summary, **facts}
        if cfg.output.save_model:
            writer.save_model(final_state(result.global_params, model))
        writer.write_summary(summary)
        say(f"completed {summary['rounds']} rounds: final accuracy {summary['final_accuracy']:.4f}; "
            f"run folder {writer.dir} (summary.json, metrics.jsonl, final_model.pt)")
        return summary
    finally:
        writer.release()


def run_round(server: Any, grid: Grid, nodes: dict[int, int], t: int, timeout: float, accept: bool,
              device: torch.device) -> None:
    """Round ``t`` through Flower: the pre-phase when the algorithm has one, training, then
    the server's close; its progress line."""
    from fedrift.engine.failures import screen

    rnd = server.open(t)
    down = up = 0
    failed: list[int] = []
    if rnd.needs_summaries:
        replies, failed, down, up = exchange(grid, nodes, rnd, SUMMARY, timeout, accept)
        if failed:  # a device failed: its client sits this round out
            rnd.jobs = [j for j in rnd.jobs if j.client_id in replies]
            rnd.weights = server.weights([j.client_id for j in rnd.jobs]) if rnd.jobs else rnd.weights
        if not rnd.jobs:
            server.close(rnd, [], failed)  # raises: no client returned, the failed counted
        server.combine(rnd, [decode(replies[j.client_id].content, "summary", device) for j in rnd.jobs])
    replies, lost, d, u = exchange(grid, nodes, rnd, TRAIN, timeout, accept)
    outputs = [client_output(j.client_id, replies[j.client_id], device) for j in rnd.jobs if j.client_id in replies]
    bad: list[int] = []
    diverged: list[int] = []
    if accept:  # as in a simulation: a non-finite loss or upload is left out
        outputs, bad, diverged = screen(outputs, t)
        u -= sum(message_bytes(replies[k]) for k in bad)  # counted as a simulation counts: the kept uploads
    failed = sorted(set(failed) | set(lost) | set(bad))
    rnd.down, rnd.up = down + d, up  # the real message sizes, not the trees'
    row = server.close(rnd, outputs, failed, up=u, diverged=diverged)
    done = f"{len(outputs)} of {len(rnd.sampled)} clients returned" + (f", {len(failed)} failed" if failed else "")
    acc = f": test_accuracy {row['test_accuracy']:.4f}, train_loss {row['train_loss']:.4g}" if row else ""
    say(f"round {t}/{server.cfg.train.rounds}{acc} ({done})")


def discover(grid: Grid, num_clients: int, wait: float) -> dict[int, int]:
    """fedrift client id -> Flower node id, for every client of the federation: each SuperNode
    is asked once which client it serves; waits up to ``wait`` seconds for all to connect."""
    deadline = time.monotonic() + wait
    found: dict[int, int] = {}
    asked: set[int] = set()
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            msgs = [Message(RecordDict(), message_type=WHO, dst_node_id=n) for n in new]
            replies = list(grid.send_and_receive(msgs, timeout=max(1.0, deadline - time.monotonic())))
            node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}  # set when pushed
            for reply in replies:
                node = node_of.get(reply.metadata.reply_to_message_id)
                if node is None:
                    continue
                if reply.has_error():
                    if reply.error.code == ErrorCode.NODE_UNAVAILABLE:  # gone since listed: asked again if back
                        continue
                    raise ConfigError(f"SuperNode {node}: {failure(reply, node)}")
                asked.add(node)
                device_error(reply, node, None)
                k = int(reply.content["fedrift"]["client"])
                if not 0 <= k < num_clients:
                    raise ConfigError(f"node config {NODE_CLIENT}: SuperNode {node} serves client {k}; allowed: "
                                      f"0 to {num_clients - 1} (partition of {num_clients} clients)")
                if k in found:
                    raise ConfigError(f"node config {NODE_CLIENT}: SuperNodes {found[k]} and {node} both serve "
                                      f"client {k}; allowed: one SuperNode per client")
                found[k] = node
        if len(found) == num_clients:
            return found
        if time.monotonic() > deadline:
            missing = sorted(set(range(num_clients)) - set(found))
            raise ConfigError(f"{WAIT_KEY}: no SuperNode served clients {missing} within {wait:g} s; allowed: "
                              f"one SuperNode per client, started with --node-config '{NODE_CLIENT}=K'")
        time.sleep(0.5)


POLL = (0.25, 3.0)  # seconds between the ServerApp's asks for a round's replies: from, doubling up to
LATE = 60.0  # seconds a round waits on replies before its log names the clients it waits on (again each such period)


def exchange(grid: Grid, nodes: dict[int, int], rnd: Any, kind: str, timeout: float, accept: bool
             ) -> tuple[dict[int, Message], list[int], int, int]:
    """Send each job's client the round's payload as a ``kind`` message: the replies by
    client, the clients that failed (with ``accept``: left out, with a warning; without, the
    run stops with a :class:`DeviceError`), bytes down and up.

    A reply is matched to its client by the message it answers (``reply_to_message_id``):
    the SuperLink's own error replies (a SuperNode that stopped sending heartbeats) come from
    the SuperLink, not from the node. A device's fedrift error (its config) stops the run,
    whatever ``accept`` says: it is a set-up to fix, not a failure to tolerate."""
    payload = encode(rnd.payload, "payload")
    msgs = {}
    for job in rnd.jobs:
        meta = ConfigRecord({"round": rnd.t, "client": job.client_id, "work": float(rnd.fate.work.get(job.client_id, 1.0))})
        content = merged(payload, RecordDict({"fedrift": meta}))
        msgs[job.client_id] = Message(content, message_type=kind, dst_node_id=nodes[job.client_id])
    down = sum(message_bytes(m) for m in msgs.values())  # sent to every job's client, as a simulation counts
    why: dict[int, str] = {}
    client_of: dict[str, int] = {}
    for k, mid in zip(msgs, grid.push_messages(list(msgs.values()))):
        if mid:
            client_of[mid] = k
        else:
            why[k] = "the SuperLink refused its message (its SuperNode left the federation)"
    replies: dict[int, Message] = {}
    start = said = time.monotonic()
    deadline = start + timeout
    pending = set(client_of)
    pause = POLL[0]
    while pending:
        for reply in grid.pull_messages(list(pending)):
            mid = reply.metadata.reply_to_message_id
            if mid not in pending:
                continue
            pending.discard(mid)
            k = client_of[mid]
            if reply.has_error():
                why[k] = failure(reply, nodes[k])
            else:
                device_error(reply, nodes[k], k)
                replies[k] = reply
        if pending and time.monotonic() >= deadline:
            for mid in pending:
                why[client_of[mid]] = f"no reply within {timeout:g} s (run config {REPLY_KEY})"
            break
        if pending and time.monotonic() - said >= LATE:
            said = time.monotonic()
            waiting(rnd.t, kind, sorted(client_of[m] for m in pending), nodes, said - start, timeout)
        if pending:  # a reply takes seconds (a ClientApp process starts): ask often first, then less
            time.sleep(pause)
            pause = min(2 * pause, POLL[1])
    for k in sorted(why):
        what = f"round {rnd.t}: client {k} failed on SuperNode {nodes[k]}: {why[k]}"
        if not accept:
            more = f" (and {len(why) - 1} more client(s))" if len(why) > 1 else ""
            raise DeviceError(f"{what}{more}; the run stopped (set engine.accept_failures=true to leave failed clients out)",
                              sorted(why))
        log.warning(f"{what}; left out (engine.accept_failures)")
    up = sum(message_bytes(r) for r in replies.values())
    return replies, sorted(why), down, up


def waiting(t: int, kind: str, clients: list[int], nodes: dict[int, int], waited: float, timeout: float) -> None:
    """A line in the ServerApp's log naming the clients (and SuperNodes) whose replies a round
    still waits on: a slow round and a lost reply read differently in ``flwr log``."""
    on = ", ".join(f"{k} (SuperNode {nodes[k]})" for k in clients)
    say(f"round {t}: waited {waited:.0f} s for the {kind} replies of clients {on}; up to {timeout:g} s "
        f"(run config {REPLY_KEY})")


def failure(reply: Message, node: int) -> str:
    """A Flower error reply in one line: what happened to the device, then Flower's reason's
    last line (a ClientApp's reason is its traceback)."""
    lines = [x.strip() for x in str(reply.error.reason).splitlines() if x.strip()]
    reason = lines[-1] if lines else "no reason given"
    code = reply.error.code
    if code == ErrorCode.NODE_UNAVAILABLE:
        return "its SuperNode is unreachable (no heartbeat: stopped, killed, or cut off)"
    if code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION:
        raise ConfigError(f"SuperNode {node}: cannot load fedrift's ClientApp ({reason}); "
                          f"allowed: a SuperNode where {INSTALL} is installed")
    if code == ErrorCode.CLIENT_APP_CRASHED:
        return f"its ClientApp process crashed ({reason})"
    return f"its ClientApp raised ({reason})"


DEVICE_ERROR = "fedrift-error"  # a reply's record: the fedrift error a device raised (its config)


def device_error(reply: Message, node: int, k: int | None) -> None:
    """Raise, as a ConfigError naming the node, the fedrift error a device replied with."""
    if DEVICE_ERROR in reply.content:
        err = reply.content[DEVICE_ERROR]
        who = f"SuperNode {node}" + (f" (client {k})" if k is not None else "")
        raise ConfigError(f"{who}: {err['message']}")


def client_output(k: int, reply: Message, device: torch.device) -> Any:
    """A device's reply as the engine's ClientOutput (its state stayed on the device)."""
    from fedrift.engine.executors.base import ClientOutput

    upload = decode(reply.content, "upload", device)
    metrics = decode(reply.content, "metrics", device)
    return ClientOutput(k, upload, None, metrics["loss"], metrics["aux"], {})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ client


client_app = ClientApp()


def answers_errors(handler: Any) -> Any:
    """A ClientApp handler whose fedrift error (a bad node config, a dataset missing on the
    device) is sent back as a reply the server reads as that error, naming this node, instead
    of a traceback that it would take for a device failure."""

    @functools.wraps(handler)
    def handle(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except FedriftError as err:
            log.error(f"fedrift: error: {err}")
            record = ConfigRecord({"error": type(err).__name__, "message": str(err)})
            return Message(RecordDict({DEVICE_ERROR: record}), reply_to=msg)

    return handle


@client_app.query("fedrift")
@answers_errors
def _who(msg: Message, context: Context) -> Message:
    meta = ConfigRecord({"client": client_id(context)})
    return Message(RecordDict({"fedrift": meta}), reply_to=msg)


@client_app.train("summary")
@answers_errors
def _summary(msg: Message, context: Context) -> Message:
    from fedrift.engine.client import client_summary

    dev, payload, job, tools = _prepare_client(msg, context)
    summary = client_summary(tools, payload, job)
    return Message(encode(summary, "summary"), reply_to=msg)


@client_app.train()
@answers_errors
def _train(msg: Message, context: Context) -> Message:
    from fedrift.engine.client import train_client

    dev, payload, job, tools = _prepare_client(msg, context)
    out = train_client(tools, payload, job, int(msg.content["fedrift"]["round"]))
    if dev.algorithm.init_client is not None:
        for key, record in encode(out.state, "fedrift-state").items():
            context.state[key] = record
    content = merged(encode(out.upload, "upload"), encode({"loss": out.loss, "aux": out.aux}, "metrics"))
    return Message(content, reply_to=msg)


def client_id(context: Context) -> int:
    """The fedrift client this SuperNode serves (node config ``partition-id``)."""
    value = context.node_config.get(NODE_CLIENT)
    if value is None or isinstance(value, bool) or not str(value).isdigit():
        raise ConfigError(f"node config {NODE_CLIENT}: {value!r}; allowed: this SuperNode's fedrift client id "
                          f"(flower-supernode --node-config '{NODE_CLIENT}=K')")
    return int(value)


class Device:
    """A device's copy of the run: its data, the training tools, the initial model's params."""

    def __init__(self, doc: dict[str, Any], root: str | None, k: int, expected: str | None = None) -> None:
        import torch

        from fedrift.engine.build import build_run, build_tools, prepare, set_cudnn_choice
        from fedrift.engine.federation import Federation

        if root is not None:
            doc = {**doc, "data": {**doc["data"], "root": root}}
        prep = prepare(doc)
        if not 0 <= k < prep.partition.num_clients:
            raise ConfigError(f"node config {NODE_CLIENT}: {k}; allowed: 0 to {prep.partition.num_clients - 1}")
        self.cfg, self.k = prep.config, k
        if expected is not None:
            check_data(prep, k, expected, root)
        if self.cfg.engine.threads is not None:
            torch.set_num_threads(self.cfg.engine.threads)
        set_cudnn_choice(self.cfg)  # the node's process trains this run alone
        model, self.algorithm = build_run(prep)
        self.tools = build_tools(prep, model, self.algorithm)
        self.fed = Federation(prep.dataset, prep.partition, prep.device)
        from fedrift.models.norm import model_state

        # the initial model state, BatchNorm's running statistics included (models/norm.py)
        self.params = model_state(model.to(prep.device))

    def state(self, context: Context) -> dict[str, Any]:
        """The client's state as this device kept it, or the algorithm's initial one (made from
        the initial model, as the engine's client-state store makes it for a client never seen)."""
        if self.algorithm.init_client is None:
            return {}
        if "fedrift-state" in context.state:
            return decode(context.state, "fedrift-state", self.fed.device)
        return self.algorithm.init_client(self.params)


def check_data(prep: Any, k: int, expected: str, root: str | None) -> None:
    """Refuse (a ConfigError, which the server reports naming this SuperNode) a device whose
    client ``k`` would train on other data than the app was built for: its fingerprint
    (``fedrift.data.fingerprint``) differs from the one the app recorded; under
    ``data.accept_changed`` a warning line on the device instead."""
    from fedrift.data.fingerprint import difference, rows_fingerprint

    found = rows_fingerprint(prep.dataset.x_train, prep.dataset.y_train, prep.partition.train[k])
    what = difference(found, expected)
    if not what:
        return
    data = prep.config.data
    where = f"data-root {root}" if root is not None else f"data.root {data.root}" if data.root else f"data.name {data.name}"
    said = f"client {k}'s training data read from {where} differs from the data the app was built with: {what}"
    if prep.config.data.accept_changed:
        log.warning(f"fedrift: {said}; trained on as it is (data.accept_changed)")
        return
    raise ConfigError(f"{said}; allowed: the files the app's config names, unchanged, or data.accept_changed=true to "
                      f"train on them knowingly (flwr run APP SUPERLINK --run-config '{OVERRIDES_KEY}=\"data.accept_changed=true\"')")


_DEVICES: dict[tuple[str, str | None, int], Device] = {}  # one per process (a ClientApp process may serve many messages)


def _prepare_client(msg: Message, context: Context) -> tuple[Device, dict[str, Any], Any, Any]:
    """This device's run, the message's payload, the client's job and the round's tools."""
    from fedrift.engine.federation import client_job
    from fedrift.engine.teacher import with_teacher

    doc = submitted_config(context.run_config)
    text = json.dumps(doc, sort_keys=True)
    root = context.node_config.get(NODE_ROOT)
    k = client_id(context)
    key = (text, None if root is None else str(root), k)
    if key not in _DEVICES:
        _DEVICES.clear()
        expected = json.loads(str(context.run_config.get(FINGERPRINTS_KEY, "{}") or "{}")).get(str(k))
        _DEVICES[key] = Device(doc, key[1], k, expected)
    dev = _DEVICES[key]
    meta = msg.content["fedrift"]
    if int(meta["client"]) != k:
        raise ConfigError(f"node config {NODE_CLIENT}: this SuperNode serves client {k}, the server sent client "
                          f"{int(meta['client'])}'s work")
    payload = decode(msg.content, "payload", dev.fed.device)
    t = int(meta["round"])
    job = client_job(dev.fed, k, dev.state(context), dev.cfg.train, dev.cfg.seed, t, work=float(meta["work"]))
    # the round's tools: at its lr under a train.lr_schedule (a pure function of config and round)
    tools = with_teacher(dev.tools.at_round(t), payload, [job], dev.cfg.engine.teacher_cache)
    return dev, payload, job, tools
