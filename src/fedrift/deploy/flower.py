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

Importing this module needs ``flwr`` (the ``flower`` extra).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Mapping

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedrift.deploy.project import CONFIG_KEY, NODE_CLIENT, NODE_ROOT, REPLY_KEY, WAIT_KEY, check_deployable
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


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    doc = json.loads(str(context.run_config[CONFIG_KEY]))
    serve(grid, doc, float(context.run_config.get(WAIT_KEY, 600.0)), float(context.run_config.get(REPLY_KEY, 3600.0)))


def serve(grid: Grid, doc: dict[str, Any], wait: float, reply_timeout: float) -> dict[str, Any]:
    """The deployed run of config ``doc`` through ``grid``; its summary (also in the run folder)."""
    import torch

    from fedrift.engine.build import build_run, final_state, prepare, resolved_yaml, run_facts, run_folder
    from fedrift.engine.federation import Federation
    from fedrift.engine.outputs import RunWriter
    from fedrift.engine.server import Server
    from fedrift.errors import DivergenceError

    prep = prepare(doc)
    cfg = prep.config
    model, algorithm = build_run(prep)
    check_deployable(cfg, algorithm)
    if cfg.engine.threads is not None:
        torch.set_num_threads(cfg.engine.threads)
    writer = RunWriter(run_folder(cfg), cfg.output.overwrite)
    facts = {**run_facts(prep, model, "flower"), "threads": torch.get_num_threads()}
    try:
        writer.write_text("config.yaml", resolved_yaml(prep))
        writer.write_partition(prep.partition)
        fed = Federation(prep.dataset, prep.partition, prep.device)
        start = time.perf_counter()
        nodes = discover(grid, fed.num_clients, wait)
        facts["connect_seconds"] = time.perf_counter() - start
        server = Server(cfg, fed, model, algorithm, writer, clients_build_teacher=True, prephase_on_clients=True)
        try:
            for t in server.rounds():
                rnd = server.open(t)
                down = up = 0
                if rnd.needs_summaries:
                    replies, down, up = exchange(grid, nodes, rnd, SUMMARY, reply_timeout, cfg.engine.accept_failures)
                    if len(replies) < len(rnd.jobs):  # a device failed: its client sits this round out
                        rnd.jobs = [j for j in rnd.jobs if j.client_id in replies]
                        rnd.weights = server.weights([j.client_id for j in rnd.jobs])
                    server.combine(rnd, [decode(replies[j.client_id].content, "summary", prep.device) for j in rnd.jobs])
                replies, d, u = exchange(grid, nodes, rnd, TRAIN, reply_timeout, cfg.engine.accept_failures)
                outputs = [client_output(k, replies[k], prep.device) for k in (j.client_id for j in rnd.jobs) if k in replies]
                failed = sorted(set(rnd.fate.returning) - set(replies))
                rnd.down, rnd.up = down + d, up  # the real message sizes, not the trees'
                server.close(rnd, outputs, failed, up=u)
        except DivergenceError as err:
            writer.write_summary({**server.result(err.status, str(err)).summary, **facts})
            raise
        finally:
            server.release()
        result = server.result()
        summary = {**result.summary, **facts}
        if cfg.output.save_model:
            writer.save_model(final_state(result.global_params, model))
        writer.write_summary(summary)
        return summary
    finally:
        writer.release()


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
            for reply in grid.send_and_receive(msgs, timeout=max(1.0, deadline - time.monotonic())):
                node = reply.metadata.src_node_id
                asked.add(node)
                if reply.has_error():
                    raise ConfigError(f"SuperNode {node}: {reply.error.reason}")
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


def exchange(grid: Grid, nodes: dict[int, int], rnd: Any, kind: str, timeout: float, accept: bool
             ) -> tuple[dict[int, Message], int, int]:
    """Send each job's client the round's payload as a ``kind`` message; its replies by client
    (a failed client is left out with ``accept``, else the run stops), bytes down and up."""
    from fedrift.engine.client import HookError

    payload = encode(rnd.payload, "payload")
    msgs = {}
    for job in rnd.jobs:
        meta = ConfigRecord({"round": rnd.t, "client": job.client_id, "work": float(rnd.fate.work.get(job.client_id, 1.0))})
        content = merged(payload, RecordDict({"fedrift": meta}))
        msgs[job.client_id] = Message(content, message_type=kind, dst_node_id=nodes[job.client_id])
    down = sum(message_bytes(m) for m in msgs.values())
    client_of = {nodes[k]: k for k in msgs}
    replies: dict[int, Message] = {}
    for reply in grid.send_and_receive(list(msgs.values()), timeout=timeout):
        k = client_of[reply.metadata.src_node_id]
        if reply.has_error():
            what = f"round {rnd.t}: client {k} failed on its SuperNode ({reply.error.reason})"
            if not accept:
                raise HookError(f"{what}; set engine.accept_failures=true to leave failed clients out")
            log.warning(f"{what} and is left out")
            continue
        replies[k] = reply
    missing = sorted(set(msgs) - set(replies))
    if missing and not accept:  # failed ones raised above: these never answered
        raise HookError(f"round {rnd.t}: no reply from the SuperNodes of clients {missing} within {timeout:g} s")
    up = sum(message_bytes(r) for r in replies.values())
    return replies, down, up


def client_output(k: int, reply: Message, device: torch.device) -> Any:
    """A device's reply as the engine's ClientOutput (its state stayed on the device)."""
    from fedrift.engine.executors.base import ClientOutput

    upload = decode(reply.content, "upload", device)
    metrics = decode(reply.content, "metrics", device)
    return ClientOutput(k, upload, None, metrics["loss"], metrics["aux"], {})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ client


client_app = ClientApp()


@client_app.query("fedrift")
def _who(msg: Message, context: Context) -> Message:
    meta = ConfigRecord({"client": client_id(context)})
    return Message(RecordDict({"fedrift": meta}), reply_to=msg)


@client_app.train("summary")
def _summary(msg: Message, context: Context) -> Message:
    from fedrift.engine.client import client_summary

    dev, payload, job, tools = _prepare_client(msg, context)
    summary = client_summary(tools, payload, job)
    return Message(encode(summary, "summary"), reply_to=msg)


@client_app.train()
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

    def __init__(self, doc: dict[str, Any], root: str | None, k: int) -> None:
        import torch

        from fedrift.engine.build import build_run, build_tools, prepare
        from fedrift.engine.federation import Federation

        if root is not None:
            doc = {**doc, "data": {**doc["data"], "root": root}}
        prep = prepare(doc)
        if not 0 <= k < prep.partition.num_clients:
            raise ConfigError(f"node config {NODE_CLIENT}: {k}; allowed: 0 to {prep.partition.num_clients - 1}")
        self.cfg, self.k = prep.config, k
        if self.cfg.engine.threads is not None:
            torch.set_num_threads(self.cfg.engine.threads)
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


_DEVICES: dict[tuple[str, str | None, int], Device] = {}  # one per process (a ClientApp process may serve many messages)


def _prepare_client(msg: Message, context: Context) -> tuple[Device, dict[str, Any], Any, Any]:
    """This device's run, the message's payload, the client's job and the round's tools."""
    from fedrift.engine.federation import client_job
    from fedrift.engine.teacher import with_teacher

    text = str(context.run_config[CONFIG_KEY])
    root = context.node_config.get(NODE_ROOT)
    k = client_id(context)
    key = (text, None if root is None else str(root), k)
    if key not in _DEVICES:
        _DEVICES.clear()
        _DEVICES[key] = Device(json.loads(text), key[1], k)
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
