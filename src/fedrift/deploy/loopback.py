"""A real Flower federation on this machine's loopback: a ``flower-superlink`` with TLS and
SuperNode authentication, one ``flower-supernode`` per fedrift client, each with its own key
registered first. What the deployment's tests and benchmark run against; the same steps as a
deployment on several machines (docs/tutorials/deploy-flower.md), with certificates made here.

Nothing leaves the machine: every address is 127.0.0.1, Flower's telemetry is off, and the
SuperLink installs no app dependencies (fedrift is already importable).

Who can submit a run: Flower 1.42 serves the SuperLink's Control API (``flwr run``), its
Runtime API (the ServerApps') and its Fleet API (the SuperNodes') on one port, and the Control
API checks no one in Flower's open-source build (account login is Flower Enterprise's). A
submitted ServerApp is any Python code, run as this user. So the port listens on 127.0.0.1
only (``LOOPBACK``), and Flower's switches for its older gRPC servers, which listen on every
interface by default, are kept out of the processes' environment (``LEGACY_GRPC``): only this
machine's processes reach it, every local user's included (see "Who can submit a run" in
docs/tutorials/deploy-flower.md). :meth:`LoopbackFederation.listening` says where each
process listens. Private keys are written readable by this user only (0600).
"""

from __future__ import annotations

import datetime
import io
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from fedrift.safe_files import write_atomic

LOOPBACK = "127.0.0.1"  # every address the federation listens on or dials
# Flower's switches for the gRPC Control and Fleet APIs it kept beside the HTTP ones, which
# listen on 0.0.0.0:9093 and 0.0.0.0:9092 unless told otherwise: never set for the federation
LEGACY_GRPC = ("FLWR_INTERNAL_GRPC_CONTROL_API", "FLWR_INTERNAL_GRPC_FLEET_API")
PRIVATE = 0o600  # a private key's mode: read and written by its owner only
PUBLIC = 0o644  # a certificate's or a public key's
_FLWR_CLI = threading.Lock()  # flwr's command line runs in this process (LoopbackFederation.flwr)
CONNECTION = "fedrift-loopback"  # the SuperLink connection's name in FLWR_HOME/config.toml
# seconds a wait goes on while no run advances (a round takes seconds here): above Flower's
# slowest recoveries, a reply whose SuperNode stopped mid-upload failed once its object push
# session lapses (180 s), a ServerApp start that outlasts its task token (30 s) launched again
STALL = 300.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """``path`` made anew with ``data`` and ``mode`` (a private key is never readable by others,
    not even for a moment): what stood at the name is removed first (a link itself, never what
    it points to), then the file is written by ``fedrift.safe_files``, never through a link."""
    path.unlink(missing_ok=True)
    write_atomic(path, data, mode)


def listening_sockets(pids: set[int]) -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket in the LISTEN state that processes ``pids`` hold
    (Linux: their /proc fds matched against /proc/net/tcp and tcp6; IPv6 addresses as
    ``ipaddress`` writes them, an IPv4-mapped one as its IPv4 address)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:  # gone meanwhile
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, size in (("tcp", 4), ("tcp6", 16)):
        try:
            rows = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hexip, hexport = fields[1].split(":")
            raw = b"".join(bytes.fromhex(hexip[i:i + 8])[::-1] for i in range(0, len(hexip), 8))  # host-order words
            ip = ipaddress.ip_address(raw) if size == 4 else ipaddress.IPv6Address(raw)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            found.add((str(ip), int(hexport, 16)))
    return found


def _rows(done: Path | None) -> int:
    """The rounds a fedrift run has finished: the rows of the metrics.jsonl beside ``done``
    (its summary.json)."""
    path = None if done is None else done.parent / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path is not None and path.exists() else 0


def _finished(entry: dict[str, Any] | None) -> bool:
    """Whether a run's ``flwr ls`` entry says it finished (completed, failed or stopped)."""
    return str((entry or {}).get("status", "")).startswith("finished")


def gaussian_blobs(n_train: int, n_test: int, dim: int, classes: int, spread: float, seed: int = 0) -> dict[str, Any]:
    """An ``npz`` dataset's arrays: ``classes`` Gaussian blobs in ``dim`` dimensions, centres
    drawn with standard deviation ``spread``, unit noise around them (deployments' data)."""
    import numpy as np

    g = np.random.default_rng(seed)
    centers = g.normal(0, spread, (classes, dim))
    y_train, y_test = g.integers(0, classes, n_train), g.integers(0, classes, n_test)
    return {"x_train": (centers[y_train] + g.normal(0, 1, (n_train, dim))).astype(np.float32), "y_train": y_train,
            "x_test": (centers[y_test] + g.normal(0, 1, (n_test, dim))).astype(np.float32), "y_test": y_test}


def make_certificates(folder: Path, nodes: int) -> None:
    """A CA, the SuperLink's certificate (for 127.0.0.1 and localhost) signed by it, and one
    EC key pair per SuperNode (OpenSSH format, as Flower's SuperNode authentication wants).
    The private keys (``server.key``, ``nodeK``) are created with mode 0600, the rest 0644
    (both less the umask); a file or link already at a name is replaced, never written through.
    The CA's key is not kept."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem(key: Any) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("fedrift test CA")).issuer_name(name("fedrift test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid[0]).not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    alt = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1]).add_extension(alt, critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_new(folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM), PUBLIC)
    _write_new(folder / "server.pem", cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
    _write_new(folder / "server.key", pem(key), PRIVATE)
    for i in range(nodes):
        node = ec.generate_private_key(ec.SECP384R1())
        _write_new(folder / f"node{i}", node.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()), PRIVATE)
        _write_new(folder / f"node{i}.pub", node.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH), PUBLIC)


class LoopbackFederation:
    """SuperLink + ``clients`` SuperNodes (node ``k`` serves fedrift client ``k``) under
    ``folder``; ``run(app)`` submits an app with ``flwr run`` and waits for it to finish.
    Use as a context manager: the processes are stopped (their process groups) on exit.

    ``isolation``: how each SuperNode runs its ClientApp processes (one per message in Flower
    1.42, whichever way): ``"subprocess"`` (Flower's default: the SuperNode starts
    ``flower-superexec``), ``"process"`` (``--isolation process`` with ``flower-superexec``
    started beside it) or ``"fork"`` (``--isolation process`` with
    ``fedrift.deploy.forkexec`` beside it, and beside the SuperLink for its ServerApps: the
    processes forked from one that has imported torch, Flower and fedrift)."""

    ISOLATIONS = ("subprocess", "process", "fork")

    def __init__(self, folder: Path, clients: int, node_config: dict[int, str] | None = None,
                 isolation: str = "subprocess") -> None:
        if isolation not in self.ISOLATIONS:
            raise ValueError(f"isolation: {isolation!r}; allowed: {', '.join(self.ISOLATIONS)}")
        self.folder, self.clients, self.isolation = folder, clients, isolation
        self.executors: dict[int, subprocess.Popen] = {}
        self.node_config = node_config or {}
        self.bin = Path(sys.executable).parent
        # Flower starts its helpers (flower-superexec, flwr-serverapp, flwr-clientapp) from PATH
        path = f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = {**{k: v for k, v in os.environ.items() if k not in LEGACY_GRPC}, "PATH": path,
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_HOME": str(folder / "flwr-home")}
        if os.environ.get("PYTHONPATH"):  # the processes run in ``folder``: its entries made absolute
            self.env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)
        self.procs: list[subprocess.Popen] = []
        self.submitted: set[str] = set()  # the ids of the runs submitted here (submit)
        self.port = free_port()

    def __enter__(self) -> "LoopbackFederation":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        certs = self.folder / "certs"
        make_certificates(certs, self.clients + 1)  # the last key is never registered
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{LOOPBACK}:{self.port}"\nroot-certificates = "{certs / "ca.crt"}"\n')
        self._spawn("superlink", "flower-superlink", "--host", LOOPBACK, "--port", str(self.port),
                    "--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "server.pem"),
                    "--ssl-keyfile", str(certs / "server.key"), "--enable-supernode-auth",
                    "--disable-runtime-dependency-installation", *self._server_isolation())
        self._wait_listening(self.port, 60)
        for k in range(self.clients):
            self.flwr("supernode", "register", str(certs / f"node{k}.pub"), CONNECTION)
        ports = []
        for k in range(self.clients):
            config = f"partition-id={k}" + (f" {self.node_config[k]}" if k in self.node_config else "")
            ports.append(free_port())
            isolation = () if self.isolation == "subprocess" else ("--isolation", "process")
            self._spawn(f"supernode{k}", "flower-supernode", "--superlink", f"127.0.0.1:{self.port}",
                        "--root-certificates", str(certs / "ca.crt"), "--auth-supernode-private-key",
                        str(certs / f"node{k}"), "--node-config", config, "--host", LOOPBACK, "--port", str(ports[k]), *isolation)
        for k in range(self.clients if self.isolation != "subprocess" else 0):  # beside SuperNode k, its Runtime API
            node = self.procs[1 + k]
            args = ("--runtime-api-address", f"127.0.0.1:{ports[k]}", "--insecure", "--parent-pid", str(node.pid))
            if self.isolation == "process":
                self.executors[k] = self._spawn(f"superexec{k}", "flower-superexec", *args)
            else:
                self.executors[k] = self._spawn(f"forkexec{k}", Path(sys.executable).name, "-m",
                                                "fedrift.deploy.forkexec", *args)
        if self._server_isolation():  # the SuperLink's ServerApps, forked beside it (after the nodes: procs[1 + k] stays node k)
            self._spawn("forkexec-server", Path(sys.executable).name, "-m", "fedrift.deploy.forkexec", "--runtime-api-address",
                        f"127.0.0.1:{self.port}", "--root-certificates", str(certs / "ca.crt"), "--parent-pid", str(self.procs[0].pid))
        self._wait_nodes(60)

    def _server_isolation(self) -> tuple[str, ...]:
        """The SuperLink's own flags for its ServerApps: under ``fork`` they are forked by a
        ``fedrift.deploy.forkexec`` beside it (``--isolation process``); otherwise the
        SuperLink starts ``flower-superexec`` and a ``flwr-serverapp`` process per run."""
        return ("--isolation", "process") if self.isolation == "fork" else ()

    def unregistered_node_refused(self, timeout: float = 30) -> tuple[bool, str]:
        """Start a SuperNode whose key was never registered: (whether it gave up, its log)."""
        certs = self.folder / "certs"
        proc = self._spawn("intruder", "flower-supernode", "--superlink", f"127.0.0.1:{self.port}",
                           "--root-certificates", str(certs / "ca.crt"), "--auth-supernode-private-key",
                           str(certs / f"node{self.clients}"), "--node-config", "partition-id=0",
                           "--port", str(free_port()), "--max-retries", "0")
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        text = (self.folder / "intruder.log").read_text(errors="replace")
        return proc.poll() not in (None, 0), text

    def flwr(self, *args: str) -> str:
        """The ``flwr`` command line, run in this process (a ``flwr`` process costs seconds of
        CPU to start); its output, or a RuntimeError with it. Its ``--format json`` output
        goes to ``sys.__stdout__``, caught here for the call."""
        from flwr.cli.app import app
        from flwr.supercore.logger import console_handler
        from typer.testing import CliRunner

        with _FLWR_CLI:  # it swaps process-wide streams: one call at a time, whatever the thread
            caught, saved, stream = io.StringIO(), sys.__stdout__, console_handler.stream
            sys.__stdout__ = caught  # type: ignore[misc]
            try:
                result = CliRunner().invoke(app, list(args), env={"FLWR_HOME": self.env["FLWR_HOME"],
                                                                  "FLWR_TELEMETRY_ENABLED": "0"})
            finally:
                sys.__stdout__, console_handler.stream = saved, stream  # type: ignore[misc]
        output = caught.getvalue() or result.output
        if result.exit_code != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed ({result.exit_code}): {output}")
        return output

    def flwr_json(self, *args: str) -> dict[str, Any]:
        """``flwr ARGS --format json``, parsed; a RuntimeError with Flower's message where it
        failed (with ``--format json`` a failed command prints its error as JSON and exits 0)."""
        out = json.loads(self.flwr(*args, "--format", "json"))
        if out.get("success") is False:
            raise RuntimeError(f"flwr {' '.join(args)} failed: {out.get('error-message', out)}")
        return out

    def nodes_online(self) -> int:
        out = self.flwr_json("supernode", "list", CONNECTION)
        return sum(1 for n in out.get("nodes", []) if n.get("status") == "online")

    def submit(self, app: Path, tries: int = 3) -> str:
        """``flwr run app``: the run's id. On a loaded machine the SuperLink may answer later
        than the CLI waits (30 s) though it started the run: after a failed ``flwr run`` a run
        that ``flwr ls`` shows and this federation did not know of is the one; with none, the
        submission is tried again, up to ``tries`` times."""
        attempt = 0
        while True:
            attempt += 1
            try:
                run_id = str(self.flwr_json("run", str(app), CONNECTION)["run-id"])
                break
            except RuntimeError as err:
                time.sleep(1)
                new = self.run_ids() - self.submitted
                if len(new) > 1 or (not new and attempt == tries):
                    raise RuntimeError(f"{err} (try {attempt} of {tries}; runs it did not know of: {sorted(new)})") from None
                if new:
                    run_id = new.pop()
                    break
        self.submitted.add(run_id)
        return run_id

    def run_ids(self) -> set[str]:
        """The ids of every run the SuperLink knows of (``flwr ls``)."""
        return set(self._listed())

    def wait(self, run_id: str, done: Path | None = None, timeout: float = 300) -> dict[str, Any]:
        """Wait for run ``run_id`` to finish: its ``flwr ls`` entry (see :meth:`wait_all`)."""
        return self.wait_all({run_id: done}, timeout)[run_id]

    def wait_all(self, runs: dict[str, Path | None], timeout: float = 300, stall: float = STALL
                 ) -> dict[str, dict[str, Any]]:
        """Wait for every run of ``runs`` (run id -> a file whose appearance means the run is
        ending, a fedrift run's summary.json, or None) to finish: their ``flwr ls`` entries.
        It waits while the runs advance (see :meth:`_wait`): a TimeoutError saying each
        unfinished run's state once nothing has advanced for ``stall`` seconds, or after
        ``timeout`` seconds in all."""
        listed = self._wait(runs, lambda k, entry: _finished(entry), "finish", timeout, stall)
        return {k: listed[k] for k in runs}

    def wait_rows(self, runs: dict[str, Path], rows: int, timeout: float = 300, stall: float = STALL) -> None:
        """Wait until every run of ``runs`` (run id -> its summary.json, as :meth:`wait_all`)
        has finished ``rows`` rounds (rows of the metrics.jsonl beside it); gives up as
        :meth:`wait_all` does."""
        self._wait(runs, lambda k, entry: _rows(runs[k]) >= rows, f"finish round {rows}", timeout, stall)

    def _wait(self, runs: dict[str, Path | None], reached: Callable[[str, dict[str, Any] | None], bool], what: str,
              timeout: float, stall: float) -> dict[str, dict[str, Any]]:
        """Wait until ``reached(run_id, its flwr ls entry)`` holds for every run: the runs'
        ``flwr ls`` entries. A loaded machine makes a run slow, not still: this waits while any
        run advances (a row in the metrics.jsonl beside its file, another status in ``flwr
        ls``), and gives up, with each late run's state (:meth:`_report`), once nothing has for
        ``stall`` seconds (a lost message, a hung process), after ``timeout`` seconds in all,
        or at once where a late run has finished (it cannot get there). The files are watched
        every 0.2 s; ``flwr ls`` (one for all the runs, under the lock every federation's CLI
        calls share) is asked every 10 s, and each second once every file is there."""
        start = moved = time.monotonic()
        asked, listed, seen = float("-inf"), {}, None
        while True:
            ending = all(done is not None and done.exists() for done in runs.values())
            if ending or time.monotonic() - asked > 10:
                listed, asked = self._listed(), time.monotonic()
            late = [k for k in sorted(runs) if not reached(k, listed.get(k))]
            if not late:
                return listed
            progress = [(str(listed.get(k, {}).get("status")), _rows(done)) for k, done in sorted(runs.items())]
            now = time.monotonic()
            if progress != seen:
                seen, moved = progress, now
            ended = [k for k in late if _finished(listed.get(k))]
            if ended or now - moved > stall or now - start > timeout:
                why = (f"runs {', '.join(ended)} finished first" if ended else
                       f"nothing advanced (rounds, Flower's status) for {now - moved:.0f} s" if now - moved > stall else
                       f"not within {timeout:g} s")
                raise TimeoutError(f"Flower runs {', '.join(late)} did not {what}: {why} ({now - start:.0f} s waited). "
                                   + self._report({k: runs[k] for k in late}, listed))
            time.sleep(1 if ending else 0.2)

    def _listed(self) -> dict[str, dict[str, Any]]:
        """Every run's ``flwr ls`` entry, by run id."""
        return {str(r["run-id"]): r for r in self.flwr_json("ls", CONNECTION)["runs"]}

    def _report(self, runs: dict[str, Path | None], listed: dict[str, dict[str, Any]]) -> str:
        """Where each run of ``runs`` stands, for a wait that gave up: Flower's status, the
        rounds it finished, whether its summary.json is written, its log's end; and how many
        SuperNodes are online."""
        lines = []
        for k, done in runs.items():
            entry = listed.get(k, {})
            summary = "written" if done is not None and done.exists() else "not written"
            lines.append(f"run {k}: flwr ls {entry.get('status', 'does not list it')} "
                         f"({entry.get('status-details') or 'no details'}), {_rows(done)} round(s) in metrics.jsonl, "
                         f"summary.json {summary}; its log ends:\n{self._tail(k)}")
        try:
            online = f"{self.nodes_online()} of {self.clients}"
        except RuntimeError as err:
            online = f"unknown ({err})"
        return "\n".join([*lines, f"SuperNodes online: {online}"])

    def _tail(self, run_id: str, chars: int = 1500) -> str:
        """The end of a run's log (:meth:`run_log`), or why it cannot be read."""
        try:
            return self.run_log(run_id)[-chars:]
        except RuntimeError as err:
            return f"(flwr log failed: {err})"

    def run(self, app: Path, done: Path | None = None, timeout: float = 300) -> dict[str, Any]:
        """``flwr run app`` and wait for it (see :meth:`wait`)."""
        return self.wait(self.submit(app), done, timeout)

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def run_log(self, run_id: str) -> str:
        """The run's log as ``flwr log RUN_ID --show`` prints it (what ``flwr run --stream``
        streams): the ServerApp's output."""
        return self.flwr("log", run_id, CONNECTION, "--show")

    def stop_node(self, k: int, sig: int = signal.SIGTERM) -> None:
        """Stop SuperNode ``k`` and its ClientApp processes (its process group), as a device
        that is switched off: SIGTERM (the SuperNode tells the SuperLink it leaves, so its
        messages fail at once) or SIGKILL (they fail once its heartbeats are missed, 60 s)."""
        for proc in (self.procs[1 + k], self.executors.get(k)):  # after the SuperLink, in client order
            if proc is not None:
                os.killpg(proc.pid, sig)
                proc.wait(30)

    def descendants(self) -> dict[int, int]:
        """Every live process that the federation's processes started, at any depth: {pid:
        process group} (read from /proc; empty where there is none)."""
        parent, group = {}, {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):  # gone meanwhile
                continue
            pid = int(stat.parent.name)
            parent[pid], group[pid] = int(fields[1]), int(fields[2])
        found, todo = {}, [p.pid for p in self.procs]
        while todo:
            pid = todo.pop()
            for child, ppid in parent.items():
                if ppid == pid and child not in found:
                    found[child] = group[child]
                    todo.append(child)
        return found

    def listening(self) -> set[tuple[str, int]]:
        """``(address, port)`` of every TCP socket the federation's processes listen on, the
        processes they started included (:func:`listening_sockets`): each address is
        ``LOOPBACK``."""
        return listening_sockets({p.pid for p in self.procs} | set(self.descendants()))

    def stop(self) -> None:
        # their process groups, taken while the processes that made them still live: a run's
        # flwr-serverapp (in its SuperExec's group) keeps retrying a stopped SuperLink after
        # SIGTERM (seen: 40 of them, 4.7 GB)
        groups = {p.pid for p in self.procs} | set(self.descendants().values())
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        deadline = time.monotonic() + 10
        while groups and time.monotonic() < deadline:  # what is still there once the processes are gone
            for pgid in list(groups):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:  # the group is empty: nothing left
                    groups.discard(pgid)
            time.sleep(0.1)
        self.procs = []

    def _spawn(self, name: str, program: str, *args: str) -> subprocess.Popen:
        with open(self.folder / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([str(self.bin / program), *args], env=self.env, cwd=self.folder, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait_listening(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[0].poll() is not None:
                raise RuntimeError(f"flower-superlink exited: {self.log('superlink')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"flower-superlink did not listen on port {port} within {timeout:g} s")

    def _wait_nodes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.nodes_online() >= self.clients:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{self.clients} SuperNodes did not come online within {timeout:g} s")
