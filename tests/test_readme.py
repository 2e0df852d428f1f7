"""Every shell command shown in README.md is run here, or validated as written where it needs
what a test cannot have (the papers' datasets, a Ray cluster, hours of training).

Validated as written: parsed by the CLI's parser and checked by the code the CLI runs before
anything is written (config, options, data, partition, model and algorithm; compare's whole
grid). Run: the same command with ``train.rounds=1`` (and one job) where the written one
trains for long; as written otherwise. Error examples must print exactly the line shown.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from fedrift.api import build_run, prepare, resolve_executor, resolve_options, shared_options
from fedrift.cli import _parser, main
from fedrift.config import load_config
from fedrift.data.download import source
from fedrift.experiments.grid import build_grid, parse_grid_tokens
from readme_commands import README, shell_commands

ROOT = README.parent
# need the papers' files (the text sets: SST-5's full encoder trains for minutes; its loader runs in tests/data)
FROM_FILES = ("cifar10", "cifar100", "tinyimagenet", "femnist", "imagefolder", "npz", "sst5", "agnews")
SHORT = ["train.rounds=1", "engine.executor=sequential"]


def _validate_run(args: list[str]) -> None:
    ns = _parser().parse_args(args)
    overrides = ns.overrides
    if any(o.startswith("data.name=") and o.split("=", 1)[1] in FROM_FILES for o in overrides):
        resolve_options(load_config(ns.config, overrides, shared_options))  # keys, values, data.root exists
        return
    prep = prepare(ns.config, overrides)
    model, _ = build_run(prep)
    resolve_executor(prep.config, prep, model)


def _validate_compare(args: list[str]) -> None:
    ns, extra = _parser().parse_known_args(args)
    grid = parse_grid_tokens([*ns.grid, *extra])
    build_grid(ns.config, grid["algorithms"], grid["seeds"], grid["sweep"], grid["overrides"], ns.out, ns.jobs)


def _fedrift_args(argv: list[str]) -> list[str] | None:
    while argv and "=" in argv[0]:
        argv = argv[1:]  # VAR=value before the command
    return argv[1:] if argv and Path(argv[0]).name == "fedrift" else None


def _shown_error(capsys, args: list[str], shown: list[str], tmp_path: Path) -> None:
    if "data.root=/data" in args:  # the README's damaged CIFAR-10 file, made here
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


def test_every_readme_command(capsys, tmp_path, monkeypatch):
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    (work / "my.yaml").write_text("data: {name: digits}\nmodel: {name: mlp}\n")  # the Ray example's own config
    home = tmp_path / "home"
    for folder in ("data", "data/sst5", "data/ag_news", "leaf/data/femnist/data", "photos", "arrays"):
        (home / folder).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    makefile = (ROOT / "Makefile").read_text()
    commands = shell_commands()
    # make demo's own command, checked and run (shortened) as the README's are
    demo = makefile.split("\ndemo:", 1)[1].split("\n\t", 1)[1].split("\n", 1)[0]
    commands.append((shlex.split(demo.replace("$(BIN)/fedrift", ".venv/bin/fedrift")), []))
    ran = set()
    for argv, shown in commands:
        if argv[0] == "make":  # the Makefile's targets (demo's command is checked above)
            assert f"\n{argv[1]}:" in makefile
            continue
        if argv[:2] == ["ray", "start"]:  # Ray's own CLI, starting a cluster (tests/engine/test_ray.py does)
            continue
        if argv[0] in ("flwr", "flower-superlink", "flower-supernode"):  # Flower's own CLI (tests/deploy/test_flower.py runs it)
            continue
        if argv[0] == "openssl":  # the deployment's certificates: made as written, checked below
            subprocess.run(argv, check=True, capture_output=True)
            ran.add("openssl")
            continue
        if argv[:3] == ["pip", "install", "-e"]:  # the example plugin: installed in the test environment
            assert (ROOT / argv[3] / "pyproject.toml").is_file()
            continue
        args = _fedrift_args(argv)
        assert args is not None, f"README command not covered by this test: {argv}"
        args = [str(Path(a.split("=", 1)[1]).expanduser()).join([a.split("=", 1)[0] + "=", ""]) if "=~/" in a else a
                for a in args]
        if shown:
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
        else:  # list, partition, report: as written
            assert main(args) == 0, capsys.readouterr().err
        ran.add(args[0])
    assert {"run", "compare", "report", "list", "partition", "tune", "select", "download", "flower", "openssl"} <= ran
    # the certificate the SuperNodes will dial: signed by the CA, its subjectAltName the server's name and address
    subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "server.pem"], check=True, capture_output=True)
    from cryptography import x509

    san = x509.load_pem_x509_certificate((work / "server.pem").read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["fl.example.org"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert (work / "runs" / "fedavg-a05" / "summary.json").is_file()
    assert (work / "runs" / "compare-compare" / "report.html").is_file()


def test_the_worked_example_prints_what_the_readme_shows(capsys, tmp_path, monkeypatch):
    """The README's printed line of the worked example, run as written: the same accuracies
    within two test images (0.002: another CPU's kernels may round differently), the folder."""
    import re

    text = README.read_text()
    shown = re.search(r"^fedprox on mnist5k .*: final accuracy ([0-9.]+), best ([0-9.]+) \(round \d+\), [0-9.]+ s\n"
                      r"results in (\S+)$", text, re.M)
    assert shown, "the worked example's printed lines are not in README.md"
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    assert main(["run", "-c", "examples/demo.yaml", "output.progress=false"]) == 0
    out = capsys.readouterr().out
    got = re.search(r"final accuracy ([0-9.]+), best ([0-9.]+) \(round \d+\)", out)
    assert abs(float(got.group(1)) - float(shown.group(1))) <= 0.002 + 1e-9, out
    assert abs(float(got.group(2)) - float(shown.group(2))) <= 0.002 + 1e-9, out
    assert f"results in {shown.group(3)}" in out and (tmp_path / shown.group(3) / "summary.json").is_file()
