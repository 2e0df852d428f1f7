"""Every shell command shown in README.md is run here, or validated as written where it needs
what a test cannot have (the papers' datasets, the network, hours of training); the docs'
pages are tests/docs/test_commands.py's. How each kind is run: ``readme_commands.run_commands``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest

from readme_commands import README, ROOT, code_blocks, doc_pages, run_commands, shell_commands, workspace


@pytest.mark.process  # the README's command lines as a user runs them: CLI runs, end to end
def test_every_readme_command(capsys, tmp_path, monkeypatch):
    """The README's commands that no docs page shows; those a page shows as well (the same
    words) tests/docs/test_docs_commands.py runs there, once."""
    work = workspace(tmp_path, monkeypatch)
    makefile = (ROOT / "Makefile").read_text()
    in_docs = {tuple(argv) for page in doc_pages() for argv, _ in shell_commands(page.read_text())}
    assert not code_blocks(README.read_text(), skipped=True), "the README runs every command it shows"
    commands = [(argv, shown) for argv, shown in shell_commands() if tuple(argv) not in in_docs or shown]
    # make demo's own command, checked and run (shortened) as the README's are
    demo = makefile.split("\ndemo:", 1)[1].split("\n\t", 1)[1].split("\n", 1)[0]
    commands.append((shlex.split(demo.replace("$(BIN)/fedrift", ".venv/bin/fedrift")), []))
    ran = run_commands(commands, tmp_path, capsys, makefile)
    assert "compare" in ran and (work / "runs" / "demo" / "compare.json").is_file()
    assert {argv[1] for argv, _ in shell_commands() if argv[0] == "make"} >= {"demo", "test", "docs"}


def test_the_readme_is_the_front_door():
    """Short, self-contained for a user (nothing outside the repository), and every page it
    links to exists."""
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "../shared" not in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    linked = {(ROOT / t).resolve() for t in re.findall(r"\]\((docs/[^)#]+\.md)", text)}
    assert (ROOT / "docs" / "getting-started.md").resolve() in linked
    assert len(linked & {p.resolve() for p in doc_pages()}) >= 10


def _worked_example_shown(text: str) -> re.Match | None:
    return re.search(r"^fedprox on mnist5k .*: final accuracy ([0-9.]+), best ([0-9.]+) \(round \d+\), [0-9.]+ s\n"
                     r"results in (\S+)$", text, re.M)


@pytest.mark.process
def test_the_worked_example_prints_what_the_readme_shows(tmp_path):
    """The README's printed line of the worked example (and Getting started's, the same),
    run as written (the command, in a process of its own): the same accuracies within five test images of mnist5k's 1,000 (0.005:
    another CPU's kernels round differently, and 30 rounds of training carry that on: the
    README's line is from an AVX2 EPYC, whose 0.9220 final was 0.9190 on an AVX-512 Xeon),
    the folder."""
    shown = _worked_example_shown(README.read_text())
    assert shown, "the worked example's printed lines are not in README.md"
    again = _worked_example_shown((ROOT / "docs" / "getting-started.md").read_text())
    assert again and again.group(0) == shown.group(0), "Getting started shows another output than the README"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    proc = subprocess.run([sys.executable, "-m", "fedrift.cli", "run", "-c", "examples/demo.yaml", "output.progress=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = re.search(r"final accuracy ([0-9.]+), best ([0-9.]+) \(round \d+\)", out)
    assert abs(float(got.group(1)) - float(shown.group(1))) <= 0.005 + 1e-9, out
    assert abs(float(got.group(2)) - float(shown.group(2))) <= 0.005 + 1e-9, out
    assert f"results in {shown.group(3)}" in out and (tmp_path / shown.group(3) / "summary.json").is_file()
