"""The shell commands shown in README.md's and the docs' code blocks, as the tests read and run them.

A page marks a block whose commands a test cannot run or check with an HTML comment on the
line before it, which says why: ``<!-- not run: needs a GPU and hours -->``. Every other
command is run (shortened where it trains for long) or validated as written, by
:func:`run_commands`, and the output lines shown under a command in its block are checked
against what it prints.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S.*?)\s*-->\s*$")


def doc_pages() -> list[Path]:
    """The docs' own Markdown pages (not the generated reference, nor the lab notebook's section
    pages the build writes into results/notebook/, nor a build)."""
    return sorted(p for p in DOCS.rglob("*.md") if not {"_generated", "_build"} & set(p.relative_to(DOCS).parts)
                  and not p.is_relative_to(DOCS / "results" / "notebook"))


def code_blocks(text: str, skipped: bool = False) -> list[tuple[str, str]]:
    """(language, body) of every fenced block; with ``skipped``, only those marked not run
    (as (reason, body)), else only those not marked."""
    out = []
    for m in re.finditer(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = NOT_RUN.search(before)
        if skipped and mark:
            out.append((mark.group(1), m.group(2)))
        elif not skipped and not mark:
            out.append((m.group(1), m.group(2)))
    return out


COMMAND = re.compile(r"^(\$ )?((\.venv/bin/)?fedrift|make|cp|ray|pip|flwr|flower-superlink|flower-supernode|openssl|RAY_\w+=\S+ fedrift) ")


def shell_commands(text: str | None = None) -> list[tuple[list[str], list[str]]]:
    """Every command of the shell blocks of ``text`` (default: the README) not marked as not
    run (continuation lines joined, comments and a leading ``$ `` removed, split as the shell
    would; ``~`` left for the caller), each with the output lines shown under it up to the
    next command."""
    text = README.read_text() if text is None else text
    out: list[tuple[list[str], list[str]]] = []
    for lang, body in code_blocks(text):
        if lang in ("python", "yaml", "toml"):
            continue
        shown: list[str] = []
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if COMMAND.match(line):
                shown = []
                out.append((shlex.split(line.removeprefix("$ "), comments=True), shown))
            elif line and out and out[-1][1] is shown:
                shown.append(line)
    return out


# ---------------------------------------------------------------------------------------
# Running them


# need the papers' files (the text sets: SST-5's full encoder trains for minutes; its loader runs in tests/data)
FROM_FILES = ("cifar10", "cifar100", "tinyimagenet", "femnist", "imagefolder", "npz", "sst5", "agnews")
SHORT = ["train.rounds=1", "engine.executor=sequential"]


def workspace(tmp_path: Path, monkeypatch) -> Path:
    """A folder to run the pages' commands in: the examples, the Ray example's own config, the
    data folders the pages name under a fresh ``$HOME``."""
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    (work / "my.yaml").write_text("data: {name: digits}\nmodel: {name: mlp}\n")  # the Ray example's own config
    home = tmp_path / "home"
    for folder in ("data", "data/sst5", "data/ag_news", "leaf/data/femnist/data", "photos", "arrays"):
        (home / folder).mkdir(parents=True)
    results = work / "benchmarks" / "results"
    results.mkdir(parents=True)
    shutil.copytree(ROOT / "benchmarks" / "results" / "r1-a05", results / "r1-a05")  # the paper tutorial's runs
    (work / "runs").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    from conftest import use_example_plugin

    use_example_plugin(tmp_path / "example-site", monkeypatch)  # what the pages' pip install -e of the example does
    return work


def _validate_run(args: list[str]) -> None:
    from fedrift.api import build_run, prepare, resolve_executor, resolve_options, shared_options
    from fedrift.cli import _parser
    from fedrift.config import load_config

    ns = _parser().parse_args(args)
    overrides = ns.overrides
    if any(o.startswith("data.name=") and o.split("=", 1)[1] in FROM_FILES for o in overrides):
        resolve_options(load_config(ns.config, overrides, shared_options))  # keys, values, data.root exists
        return
    prep = prepare(ns.config, overrides)
    model, _ = build_run(prep)
    resolve_executor(prep.config, prep, model)


def _validate_compare(args: list[str]) -> None:
    from fedrift.cli import _parser
    from fedrift.experiments.grid import build_grid, parse_grid_tokens

    ns, extra = _parser().parse_known_args(args)
    grid = parse_grid_tokens([*ns.grid, *extra])
    build_grid(ns.config, grid["algorithms"], grid["seeds"], grid["sweep"], grid["overrides"], ns.out, ns.jobs)


def _fedrift_args(argv: list[str]) -> list[str] | None:
    while argv and "=" in argv[0]:
        argv = argv[1:]  # VAR=value before the command
    return argv[1:] if argv and Path(argv[0]).name == "fedrift" else None


def _shown_error(capsys, args: list[str], shown: list[str], tmp_path: Path) -> None:
    from fedrift.cli import main

    if "data.root=/data" in args:  # the docs' damaged CIFAR-10 file, made here
        import importlib.util

        spec = importlib.util.spec_from_file_location("formats", ROOT / "tests" / "data" / "formats.py")
        formats = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(formats)
        batch = formats.cifar10(tmp_path / "data") / "data_batch_3"
        batch.write_bytes(batch.read_bytes()[:-10])
        args = [a.replace("/data", str(tmp_path / "data")) for a in args]
        shown = [s.replace("/data/", f"{tmp_path / 'data'}/") for s in shown]
    out = [] if any(a.startswith("output.dir=") for a in args) else [f"output.dir={tmp_path / 'refused'}"]
    assert main([*args, *out]) == 2
    assert capsys.readouterr().err.strip().splitlines() == shown
    assert not (tmp_path / "refused").exists()


def _shown_output(printed: str, shown: list[str], args: list[str]) -> None:
    """Every line shown under a command that succeeded is a line it printed (``...`` elides)."""
    lines = {" ".join(line.split()) for line in printed.splitlines()}
    for line in shown:
        if line != "...":
            assert " ".join(line.split()) in lines, f"fedrift {' '.join(args)}: shown {line!r} is not printed:\n{printed}"


def run_commands(commands: list[tuple[list[str], list[str]]], tmp_path: Path, capsys, makefile: str) -> set[str]:
    """Run or validate each command (module docstring); returns the kinds that ran. Validated
    as written: parsed by the CLI's parser and checked by the code the CLI runs before anything
    is written (config, options, data, partition, model and algorithm; compare's whole grid).
    Run: the same command with ``train.rounds=1`` (and one job) where the written one trains
    for long; as written otherwise. Error examples must print exactly the lines shown."""
    from fedrift.cli import _parser, main
    from fedrift.data.download import source

    ran: set[str] = set()
    for argv, shown in commands:
        if argv[0] == "make":  # the Makefile's targets (demo's command is checked by the README's test)
            assert f"\n{argv[1]}:" in makefile, f"make {argv[1]}: no such target in the Makefile"
            continue
        if argv[:2] == ["ray", "start"]:  # Ray's own CLI, starting a cluster (tests/engine/test_ray.py does)
            continue
        if argv[0] in ("flwr", "flower-superlink", "flower-supernode"):  # Flower's own CLI (tests/deploy/test_flower.py runs it)
            continue
        if argv[0] == "openssl":  # the deployment's certificates: made as written, checked by the caller
            subprocess.run(argv, check=True, capture_output=True)
            ran.add("openssl")
            continue
        if argv[0] == "cp":  # a copy inside the workspace (the committed runs a tutorial reads)
            subprocess.run(argv, check=True, capture_output=True)
            continue
        if argv[:3] == ["pip", "install", "-e"]:  # the example plugin: on the path as installed (workspace)
            assert (ROOT / argv[3] / "pyproject.toml").is_file()
            continue
        args = _fedrift_args(argv)
        assert args is not None, f"command not covered by this test: {argv}"
        args = [str(Path(a.split("=", 1)[1]).expanduser()).join([a.split("=", 1)[0] + "=", ""]) if "=~/" in a else a
                for a in args]
        if shown and shown[0].startswith("fedrift: error:"):
            _shown_error(capsys, args, shown, tmp_path)
        elif args[0] == "run":
            _validate_run(args)
            if "-c" in args and "ray" not in " ".join(args):
                assert main([*args, *SHORT, "output.progress=false"]) == 0, capsys.readouterr().err
        elif args[0] == "compare":
            _validate_compare(args)
            if "examples/workload_a.yaml" not in args:  # (that one: hours)
                fast = [a for a in args if a not in ("--jobs", "2")]
                if "runs/demo" in args:  # make demo's five methods: one seed of each (no report reads them)
                    fast = ["seeds=0" if a == "seeds=0,1" else a for a in fast]
                assert main([*fast, *SHORT, "--jobs", "1", "--no-report"]) == 0, capsys.readouterr().err  # report: next
        elif args[0] == "tune":  # its trials are runs: fewer and shorter ones
            fast = [a for a in args if a not in ("--jobs", "2", "--trials", "6")]
            assert main([*fast, *SHORT, "--trials", "1", "--no-report"]) == 0, capsys.readouterr().err
        elif args[0] == "select":  # a search and its confirmation: the smallest that recommends (not 2 hours)
            fast = [a for a in args if a not in ("--jobs", "2", "--budget", "2h")]
            assert main([*fast, *SHORT, "--budget-rounds", "10", "algorithms=fedavg,fedprox", "top=1", "seeds=1,2",
                         "startup=1", "--no-report"]) == 0, capsys.readouterr().err
        elif args[0] == "flower":  # the app project: as written, with the config's folder on this machine
            assert main([a.replace("/srv/runs", str(tmp_path / "srv")) for a in args]) == 0, capsys.readouterr().err
        elif args[0] == "download":  # needs the network: parsed, and the name checked against the table
            ns = _parser().parse_args(args)
            assert source(ns.name).url.startswith(("https://", "http://")) and ns.root
        else:  # list, partition, report: as written, and what they print against what the page shows
            capsys.readouterr()
            assert main(args) == 0, capsys.readouterr().err
            if shown:
                _shown_output(capsys.readouterr().out, shown, args)
        ran.add(args[0])
    return ran
