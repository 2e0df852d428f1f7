"""Who can submit a run to a SuperLink started fedrift's way (``LoopbackFederation``): only this
machine's processes. Flower 1.42 serves the Control API (what ``flwr run`` calls), the Runtime
API and the Fleet API on one port, and checks no one on the Control API in its open-source
build; so the port, and every other socket of the federation's processes (a SuperNode's
Runtime API among them), listens on 127.0.0.1 only, and from this machine's outside address
the port refuses connections. Flower's switches for its older gRPC servers (which listen on
0.0.0.0) are set here and must not reach them."""

from __future__ import annotations

import importlib.util
import socket

import pytest

# flwr is an optional extra that `make test` installs: its absence is a set-up error, not a skip
assert importlib.util.find_spec("flwr") is not None, "the flower extra is missing: make test installs it (pip install 'fedrift[flower]')"

from fedrift.deploy.loopback import LEGACY_GRPC, LOOPBACK, LoopbackFederation  # noqa: E402

pytestmark = pytest.mark.process  # a SuperLink: left out of make check


def _outside_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.255", 9))  # TEST-NET-1: routed by the default route, if any
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_the_control_api_listens_on_loopback_only(tmp_path, monkeypatch):
    for name in LEGACY_GRPC:
        monkeypatch.setenv(name, "1")
    with LoopbackFederation(tmp_path, clients=1) as fed:  # started: its Control API answered flwr on loopback
        listening = fed.listening()
        outside = _outside_address()
        if outside is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((outside, fed.port), timeout=5).close()
    assert (LOOPBACK, fed.port) in listening and len(listening) >= 2  # the SuperLink's port, and its SuperNode's
    assert {address for address, _ in listening} == {LOOPBACK}, listening
