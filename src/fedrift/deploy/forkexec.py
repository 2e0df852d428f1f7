"""A SuperExec whose app processes are forked from one warm process instead of started
fresh: beside a SuperNode started with ``--isolation process`` (its ClientApps), or beside a
SuperLink started with ``--isolation process`` (its ServerApps).

Flower 1.42 runs every message in its own ``flwr-clientapp`` process (``run_clientapp``
serves one task, named by its token, and exits), also under ``--isolation process``, where
``flower-superexec`` started beside the SuperNode launches them; a SuperLink starts a
``flwr-serverapp`` process per run the same way. Each start pays Python, torch, Flower and
fedrift's imports (about 3 s of CPU on this project's machine) before the app does anything.
This process imports them once, then asks the Runtime API for tasks as ``flower-superexec``
does (Flower's own loop) and forks a child per task that runs Flower's own ``run_clientapp``
or ``run_serverapp`` with the task's token: each message or run still runs in a process of
its own, which exits when the task ends, so nothing of one message (or run) reaches the next.

    python -m fedrift.deploy.forkexec --runtime-api-address 127.0.0.1:9094 --insecure
    python -m fedrift.deploy.forkexec --runtime-api-address 127.0.0.1:9093 --root-certificates ca.crt

The first beside ``flower-supernode --isolation process --port 9094 ...``, the second beside
``flower-superlink --isolation process ...`` (its Runtime API is the SuperLink's own address
and TLS), each on the same machine. ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (seconds between
asks, Flower's default 1) applies.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


class ForkExecutor:
    """Flower's SuperExec executor interface (``flwr.supercore.superexec.executor``): each
    ClientApp or ServerApp task runs in a child forked from this warm process."""

    def __init__(self) -> None:
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types: set[Any], **_: Any) -> tuple[set[Any], set[str]]:
        from flwr.supercore.constant import TaskType

        return {t for t in supported_task_types if t in (TaskType.CLIENT_APP, TaskType.SERVER_APP)}, set()

    def wait_for_capacity(self, *_: Any, **__: Any) -> None:
        """No capacity gate: a fork per task, as Flower's subprocess executor starts one."""

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.superexec.executor import LaunchResult

        pid = os.fork()
        if pid == 0:  # the child: one task, then out, without the parent's exit handlers
            os._exit(run_task(spec))
        self.children.add(pid)
        print(f"fedrift forkexec: task {spec.task_id} in process {pid}", file=sys.stderr, flush=True)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the children whose task ended."""
        for pid in list(self.children):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        self.reconcile()


def run_task(spec: Any) -> int:
    """Flower's ClientApp or ServerApp process body for one task: its exit status."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    certificates = validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure)
    try:
        if spec.task_type == TaskType.SERVER_APP:
            _run_serverapp(spec, certificates)
        else:
            from flwr.supernode.runtime.run_clientapp import run_clientapp

            run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token, insecure=spec.insecure,
                          certificates=certificates, parent_pid=os.getppid(),
                          runtime_dependency_install=spec.runtime_dependency_install)
        code: Any = 0
    except SystemExit as done:  # run_clientapp and run_serverapp end with flwr_exit
        code = done.code
    except BaseException:  # noqa: BLE001 -- a child must never return into the parent's loop
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code if isinstance(code, int) else (0 if code is None else 1)


def _run_serverapp(spec: Any, certificates: bytes | None) -> None:
    """What ``flwr-serverapp`` does with its arguments: the run's output mirrored to the queue
    that Flower uploads as the run's log (``flwr log``), then Flower's own ``run_serverapp``."""
    from queue import Queue

    from flwr.supercore.logger import mirror_output_to_queue, restore_output
    from flwr.superlink.runtime import run_serverapp

    log_queue: Queue[str | None] = Queue()
    mirror_output_to_queue(log_queue)
    try:
        run_serverapp(runtime_api_address=spec.runtime_api_address, log_queue=log_queue, token=spec.token,
                      insecure=spec.insecure, certificates=certificates, parent_pid=os.getppid(),
                      runtime_dependency_install=spec.runtime_dependency_install)
    finally:
        restore_output()


def warm() -> None:
    """What every ClientApp or ServerApp process would import: imported once, here, before any fork."""
    import torch  # noqa: F401

    import fedrift.deploy.flower  # noqa: F401
    import fedrift.engine.build  # noqa: F401
    import fedrift.engine.client  # noqa: F401
    import fedrift.engine.federation  # noqa: F401
    import fedrift.engine.teacher  # noqa: F401
    import flwr.superlink.runtime  # noqa: F401
    import flwr.supernode.runtime.run_clientapp  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fedrift.deploy.forkexec", description=__doc__.split("\n\n")[0])
    p.add_argument("--runtime-api-address", required=True,
                   help="the SuperNode's Runtime API (its --port), or the SuperLink's (its own address)")
    p.add_argument("--insecure", action="store_true", help="the Runtime API without TLS (the SuperNode's default)")
    p.add_argument("--root-certificates", default=None, help="CA of the Runtime API's certificate, when it has TLS")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    args = p.parse_args(argv)
    warm()
    import flwr.supercore.superexec.run_superexec as superexec

    # Flower's own SuperExec loop (asks for tasks, launches them, reports launch results),
    # with this executor in place of the one it would build (a subprocess per task)
    superexec.get_executor = lambda *_, **__: ForkExecutor()  # type: ignore[assignment]
    superexec.run_superexec(runtime_api_address=args.runtime_api_address, insecure=args.insecure,
                            root_certificates_path=args.root_certificates, parent_pid=args.parent_pid)


if __name__ == "__main__":
    main()
