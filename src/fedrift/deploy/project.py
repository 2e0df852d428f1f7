"""``fedrift flower app DIR``: a Flower app project that deploys one fedrift config.

The project is a ``pyproject.toml`` whose ``[tool.flwr.app.components]`` point at fedrift's
ServerApp and ClientApp (:mod:`fedrift.deploy.flower`) and whose run config carries the
resolved fedrift config (JSON). ``flwr run DIR SUPERLINK`` sends it to a SuperLink; the
ServerApp runs the server half there, each SuperNode's ClientApp the client half. The run
config also carries each client's data fingerprint, taken here from the data the config
names (a SuperNode whose data differs is refused by name), and ``fedrift-overrides``, for a
submission that changes only the run folder: ``flwr run DIR SUPERLINK --run-config
'fedrift-overrides="output.overwrite=true"'``.
Needs the ``flower`` extra (``flwr``); checked here so that a missing package is one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from fedrift.engine.deployed_run import AGAIN, MARKER, RESUBMIT, deployed  # noqa: F401 - MARKER, RESUBMIT, deployed: their import path
from fedrift.errors import ConfigError, writing
from fedrift.safe_files import make_dir, write_atomic

if TYPE_CHECKING:  # imported where used: a SuperNode answering who it serves loads no torch
    from fedrift.algorithms.base import Algorithm
    from fedrift.config import Config

CONFIG_KEY = "fedrift-config"  # run config: the resolved fedrift config, as JSON
WAIT_KEY = "wait-seconds"  # run config: how long the ServerApp waits for every client's SuperNode
REPLY_KEY = "reply-seconds"  # run config: how long it waits for a round's replies
FINGERPRINTS_KEY = "data-fingerprints"  # run config: each client's data fingerprint where the app was built (JSON)
OVERRIDES_KEY = "fedrift-overrides"  # run config: key=value overrides at submission (flwr run --run-config)
RESUBMITTABLE = ("output.", "data.accept_changed")  # what OVERRIDES_KEY may change: nothing the clients' work depends on
NODE_CLIENT = "partition-id"  # node config: the fedrift client id a SuperNode serves
NODE_ROOT = "data-root"  # node config: where that SuperNode reads the dataset (data.root)
INSTALL = "pip install 'fedrift[flower]'"


def require_flwr() -> Any:
    """The ``flwr`` package, or one line naming the extra that installs it."""
    try:
        import flwr
    except ImportError:
        raise ConfigError(f"flower: a Flower deployment needs the flwr package; install it with {INSTALL}") from None
    return flwr


def check_deployable(cfg: "Config", algorithm: "Algorithm") -> None:
    """Refuse what a deployment cannot do: whatever reads the clients' states or local models
    on the server, which stay on the devices; the simulation's own knobs (dropout and
    stragglers would skip or cut short real devices, whose failures are their own); and what
    only the in-process loop honours (a Ray cluster, checkpoints)."""
    eng = cfg.engine
    for key, value in (("engine.dropout", eng.dropout), ("engine.stragglers", eng.stragglers)):
        if value:
            raise ConfigError(f"{key}: simulates clients that fail; a Flower deployment's clients are real devices, "
                              "whose failures are their own (engine.accept_failures=true leaves failed ones out); "
                              "allowed: 0")
    if eng.executor == "ray" or eng.ray_address is not None:
        key = "engine.executor" if eng.executor == "ray" else "engine.ray_address"
        raise ConfigError(f"{key}: a Flower deployment trains each client on its own SuperNode, not on a Ray "
                          "cluster; allowed: engine.executor sequential or auto, engine.ray_address unset")
    if eng.compile:
        raise ConfigError("engine.compile: true compiles the simulation's vectorised step; a Flower deployment trains "
                          "each client alone on its own SuperNode; allowed: false")
    if eng.checkpoint_every:
        raise ConfigError(f"engine.checkpoint_every: {eng.checkpoint_every}; {AGAIN}; allowed: 0 or unset")
    if algorithm.personal:
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.name} is evaluated on each client's personal model, which stays on "
            "its device in a Flower deployment; allowed: an algorithm with one global model (fedrift list)")
    if algorithm.client_model is not None:
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.name} is evaluated on each client's model with the part it keeps "
            "(FedBN: its BatchNorm), which stays on its device in a Flower deployment, so the server could "
            "score no client's model; allowed: an algorithm with one global model (fedrift list)")
    if algorithm.calibration is not None:
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.name} calibrates on every client's feature statistics of the global model "
            "at evaluation, an exchange with every device the Flower apps do not make; allowed: an algorithm "
            "without calibration (fedrift list)")
    for key, on in (("eval.personalize", cfg.eval.personalize), ("eval.drift", cfg.eval.drift)):
        if on:
            raise ConfigError(f"{key}: reads the clients' local models, which stay on the devices in a Flower "
                              "deployment; allowed: false")


def _raw(config: Any, overrides: list[str]) -> dict[str, Any]:
    """The config as given (file or dict, plus overrides), before defaults fill it in."""
    from fedrift.config import Config, apply_overrides, read_yaml

    if isinstance(config, Config):
        doc: dict[str, Any] = config.model_dump()
    elif isinstance(config, (str, Path)):
        doc = read_yaml(config)
    else:
        doc = dict(config or {})
    return apply_overrides(doc, overrides)


def write_app(out: Path, config: str | Mapping[str, Any] | None, overrides: list[str] | None = None,
              wait_seconds: float = 600.0) -> Path:
    """Write the app project for ``config`` into ``out`` (a new or empty folder); its path.
    The config is checked here as ``fedrift run`` would, plus the deployment's refusals."""
    require_flwr()
    import tomli_w  # comes with flwr

    from fedrift import yamlio
    from fedrift.engine.build import build_run, prepare, resolved_yaml

    overrides = list(overrides or [])
    if "checkpoint_every" not in (_raw(config, overrides).get("engine") or {}):
        overrides.append("engine.checkpoint_every=0")  # the default's checkpoints: none when deployed
    prep = prepare(config, overrides)
    _, algorithm = build_run(prep)
    check_deployable(prep.config, algorithm)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"DIR: {str(out)!r} exists and is not an empty folder; allowed: a new folder")
    text = resolved_yaml(prep)
    doc = yamlio.load(text)
    name = f"fedrift-{prep.config.algorithm.name}".replace("_", "-")
    from fedrift.data.fingerprint import client_fingerprints

    prints = client_fingerprints(prep.dataset, prep.partition)  # what each SuperNode's data must match
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": name, "version": "1.0.0", "description": "fedrift deployed with Flower",
                    "license": "Apache-2.0", "dependencies": ["fedrift[flower]"]},
        "tool": {"flwr": {"app": {
            "publisher": "fedrift",
            "components": {"serverapp": "fedrift.deploy.flower:server_app",
                           "clientapp": "fedrift.deploy.flower:client_app"},
            "config": {CONFIG_KEY: json.dumps(doc, sort_keys=True), WAIT_KEY: float(wait_seconds), REPLY_KEY: 3600.0,
                       FINGERPRINTS_KEY: json.dumps({str(k): v for k, v in prints.items()}), OVERRIDES_KEY: ""},
        }}},
    }
    with writing("DIR", "; allowed: a folder this user can write"):
        make_dir(out)
        write_atomic(out / "pyproject.toml", tomli_w.dumps(project))
        write_atomic(out / "fedrift.yaml", text)  # to read; the run uses pyproject's copy
        write_atomic(out / CHECKLIST, checklist(prep.config, prep.partition.num_clients, out, wait_seconds))
    return out


def submitted_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The fedrift config of a submitted app: the app's, with the run config's ``fedrift-overrides``
    (``flwr run APP SUPERLINK --run-config 'fedrift-overrides="output.overwrite=true"'``): a
    run folder that exists is overwritten, or another one named, without rebuilding the app.
    Only ``output.*`` and ``data.accept_changed`` may change there: the clients' work is the
    app's, which the data fingerprints were taken for."""
    import shlex

    from fedrift.config import apply_overrides

    doc = json.loads(str(run_config[CONFIG_KEY]))
    raw = str(run_config.get(OVERRIDES_KEY, "") or "")
    try:
        overrides = shlex.split(raw)
    except ValueError as err:
        raise ConfigError(f"run config {OVERRIDES_KEY}: {raw!r} is not key=value pairs ({err})") from None
    for item in overrides:
        key = item.partition("=")[0]
        if "=" not in item or not key.startswith(RESUBMITTABLE) or (key.startswith("data.") and key != "data.accept_changed"):
            raise ConfigError(f"run config {OVERRIDES_KEY}: {item!r}; allowed: output.KEY=VALUE (e.g. output.overwrite=true, "
                              "output.dir=/abs/folder) and data.accept_changed=true; other keys: a new app (fedrift flower app)")
    return apply_overrides(doc, overrides)


CHECKLIST = "DEPLOY.md"  # in the app folder: the steps from this config to separate machines


def checklist(cfg: "Config", n: int, out: Path, wait_seconds: float) -> str:
    """The steps from a simulation config to a SuperLink and SuperNodes on other machines, for
    this config (its client count and threads), as the checklist in docs/tutorials/deploy-flower.md
    gives them: what a first deployment gets wrong is the certificate's address, who can reach
    the SuperLink's Control API (and so run code on it), the client count, fedrift missing on a
    device, and threads that make results differ from simulation."""
    threads = cfg.engine.threads
    equal = ("engine.threads is 1: the deployed run equals `fedrift run` of this config bit for bit" if threads == 1
             else f"engine.threads is {'auto' if threads is None else threads}: set engine.threads=1 for results equal to `fedrift run` of this config")
    steps = [
        "1. Certificates: a CA, and the SuperLink's certificate signed by it whose subjectAltName holds the address "
        "the SuperNodes dial and 127.0.0.1 and localhost (the SuperLink's own ServerApps and your SSH tunnel dial those; "
        "the docs' 'Deploy with Flower' page, docs/tutorials/deploy-flower.md, has the openssl commands); an ECDSA key pair per "
        "device (ssh-keygen -t ecdsa -b 384 -N \"\" -f device0), registered once: flwr supernode register device0.pub SUPERLINK.",
        "2. Who can submit a run: whoever reaches the SuperLink's port, and a run's ServerApp is any code, run as the "
        "SuperLink's user (its ClientApp on every device). Flower 1.42 serves the Control API (flwr run) on the port the "
        "SuperNodes use and checks no one there: start the SuperLink on loopback only (flower-superlink --host 127.0.0.1 "
        "--port 9093 ..., never 0.0.0.0), submit through SSH (ssh -N -L 9093:127.0.0.1:9093 you@SERVER, the SUPERLINK "
        "connection's address being 127.0.0.1:9093), and let the SuperNodes in through a proxy that passes /v1/fleet/ "
        "only (the page's section 'Who can submit a run' has the nginx configuration).",
        f"3. One SuperNode per client: the partition has {n} clients (partition.num_clients), so {n} SuperNodes, device K started with "
        f"--node-config 'partition-id=K data-root=\"...\"' for K = 0 ... {n - 1}; several on one machine each need "
        "their own --port.",
        "4. fedrift on every machine: install fedrift[flower] (this version) on the server and on every device; the "
        "SuperLink runs with --disable-runtime-dependency-installation (a run installs no packages there).",
        f"5. {equal}.",
        f"6. Waiting: the ServerApp waits {wait_seconds:g} s for the SuperNodes (--wait) and each round up to "
        "reply-seconds (3600; flwr run ... --run-config 'reply-seconds=600') for a reply.",
        "7. Restarts: start the SuperLink with --database state.db so that registrations and runs survive a restart.",
        f"8. Run: flwr run {out} SUPERLINK --stream; Flower's exit code does not carry the outcome: check "
        "flwr ls SUPERLINK --run-id ID, or status in the run folder's summary.json.",
        f"9. Again (a run folder is never reused silently): flwr run {out} SUPERLINK --stream --run-config "
        f"'{OVERRIDES_KEY}=\"output.overwrite=true\"' (or \"output.dir=/a/new/folder\"); no rebuild needed.",
    ]
    return "\n".join([f"# Deploying {out}", "", *steps, ""])
