"""The loopback federation's certificates (``make_certificates``): every private key is created
readable by its owner only (0600, whatever the umask), and a link at a key's name is replaced,
never written through. No process is started."""

from __future__ import annotations

import os
import stat

from fedrift.deploy.loopback import make_certificates

PRIVATE = ("server.key", "node0", "node1")
PUBLIC = ("ca.crt", "server.pem", "node0.pub", "node1.pub")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_keys_are_owner_only_and_public_files_are_not_writable_by_others(tmp_path):
    saved = os.umask(0)  # the widest umask: the modes asked for at creation are the modes given
    try:
        make_certificates(tmp_path, nodes=2)
    finally:
        os.umask(saved)
    assert {name: _mode(tmp_path / name) for name in PRIVATE} == dict.fromkeys(PRIVATE, 0o600)
    assert {name: _mode(tmp_path / name) for name in PUBLIC} == dict.fromkeys(PUBLIC, 0o644)
    assert b"PRIVATE KEY" in (tmp_path / "server.key").read_bytes()


def test_a_link_at_a_keys_name_is_replaced_not_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not a key")
    certs = tmp_path / "certs"
    certs.mkdir()
    os.symlink(elsewhere, certs / "server.key")
    make_certificates(certs, nodes=1)
    assert elsewhere.read_text() == "not a key"
    assert stat.S_ISREG(os.lstat(certs / "server.key").st_mode) and _mode(certs / "server.key") == 0o600
