"""A local Ray started by the ray executor (no ``engine.ray_address``) is asked to listen on
loopback only; joining a cluster changes nothing. ``ray.init`` is replaced here by a function
that notes what Ray's own code would see: no Ray process is started (tests/engine/test_ray.py
starts real ones)."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest

# ray is an optional extra that `make test` installs: its absence is a set-up error, not a skip
assert importlib.util.find_spec("ray") is not None, "the ray extra is missing: make test installs it (pip install 'fedrift[ray]')"

import ray  # noqa: E402
from ray._private import ray_constants, services  # noqa: E402

from fedrift.engine.executors import ray_actors  # noqa: E402


class _Seen(Exception):
    """Raised by the fake ray.init once it has noted what it saw: nothing runs further."""


def _start(monkeypatch, address: str | None) -> dict:
    """What ``ray.init`` sees when the executor starts its Ray: its arguments, the node address
    Ray would take for this machine, the switch the Ray processes it starts inherit."""
    seen: dict = {}

    def init(**kwargs):
        seen.update(kwargs=kwargs, node_ip=services.get_node_ip_address(),
                    env=os.environ.get(ray_actors.LOOPBACK_ONLY[0]))
        raise _Seen

    monkeypatch.delenv(ray_actors.LOOPBACK_ONLY[0], raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray._private.worker, "_global_node", None)  # a Ray an earlier test of this process started
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_actors, "check_head", lambda address: None)
    cfg = SimpleNamespace(engine=SimpleNamespace(ray_address=address, workers=2, teacher_cache=None))
    with pytest.raises(_Seen):
        ray_actors.RayExecutor(cfg)._start()
    return seen


def test_a_local_ray_listens_on_loopback_only(monkeypatch):
    cluster = ray_constants.ENABLE_RAY_CLUSTER
    seen = _start(monkeypatch, None)
    assert seen["kwargs"]["address"] == "local" and seen["kwargs"]["num_cpus"] == 2
    assert seen["node_ip"] == "127.0.0.1"  # the node's address: its servers bind to it
    assert seen["env"] == "0"  # the same in every process that ray.init starts
    # afterwards as before: a later run of this process may join a cluster elsewhere
    assert ray_constants.ENABLE_RAY_CLUSTER == cluster and ray_actors.LOOPBACK_ONLY[0] not in os.environ


def test_joining_a_cluster_leaves_rays_addresses_alone(monkeypatch):
    seen = _start(monkeypatch, "10.0.0.5:6379")
    assert seen["kwargs"]["address"] == "10.0.0.5:6379" and "num_cpus" not in seen["kwargs"]
    assert seen["env"] is None
