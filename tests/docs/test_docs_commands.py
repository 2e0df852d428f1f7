"""Every shell command shown in the docs' pages is run here, or validated as written where it
needs what a test cannot have, as the README's are (``readme_commands.run_commands``); the
output lines a page shows under a command are checked against what it prints. A block a test
cannot run carries ``<!-- not run: why -->`` on the line before it."""

from __future__ import annotations

import subprocess

import pytest

from readme_commands import ROOT, code_blocks, doc_pages, run_commands, shell_commands, workspace

TUTORIALS = ROOT / "docs" / "tutorials"


@pytest.mark.process
def test_every_docs_command(capsys, tmp_path, monkeypatch):
    work = workspace(tmp_path, monkeypatch)
    makefile = (ROOT / "Makefile").read_text()
    commands = [c for page in doc_pages() if page.name != "notebook.md" for c in shell_commands(page.read_text())]
    ran = run_commands(commands, tmp_path, capsys, makefile)
    assert {"run", "compare", "report", "list", "partition", "tune", "select", "download", "flower", "openssl"} <= ran
    # the certificate the SuperNodes will dial: signed by the CA, its subjectAltName the server's name and address
    subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "server.pem"], check=True, capture_output=True)
    from cryptography import x509

    san = x509.load_pem_x509_certificate((work / "server.pem").read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.org", "localhost"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5", "127.0.0.1"]
    assert (work / "runs" / "fedavg-a05" / "summary.json").is_file()
    assert (work / "runs" / "compare-compare" / "report.html").is_file()


def test_every_tutorial_has_commands_and_says_why_any_is_not_run():
    """A tutorial is learning by doing: each shows commands the suite runs; a block it does
    not run names its reason."""
    for page in sorted(TUTORIALS.glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        assert shell_commands(text), f"{page.name}: no command the suite runs"
        for reason, _ in code_blocks(text, skipped=True):
            assert len(reason.split()) >= 3, f"{page.name}: 'not run' needs a reason, got {reason!r}"
