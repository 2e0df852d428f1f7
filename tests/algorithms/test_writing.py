"""Writing an algorithm as the docs' tutorial shows (docs/tutorials/write-an-algorithm.md): its script runs as written (twice: a notebook cell
run again), re-registration, and one message for a hook's wrong return under every executor."""

from __future__ import annotations

import runpy
import subprocess
import sys

import pytest

from fedrift.algorithms import ALGORITHMS
from fedrift.registry import Registry
from readme_commands import DOCS, code_blocks


def _example() -> str:
    blocks = [body for lang, body in code_blocks((DOCS / "tutorials" / "write-an-algorithm.md").read_text()) if lang == "python" and '"myprox"' in body]
    assert len(blocks) == 1
    return blocks[0]


def test_the_readme_example_runs_as_written_and_again(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "myprox.py"
    script.write_text(_example())
    try:
        for _ in range(2):  # run as a script, twice in one process: the same definition replaces the entry
            runpy.run_path(str(script), run_name="__main__")
            final, prox = capsys.readouterr().out.split()
            assert 0.0 <= float(final) <= 1.0 and float(prox) > 0
    finally:
        ALGORITHMS._entries.pop("myprox", None)


def test_a_taken_name_is_refused_unless_replaced_or_the_same_definition():
    reg: Registry = Registry("algorithm")

    def make(hp, setup):
        return None

    def other(hp, setup):
        return None

    reg.register("x", "first")(make)
    reg.register("x", "again")(make)  # same module and name: replaced
    assert reg.get("x").doc == "again"
    with pytest.raises(ValueError, match=r"'x' is registered already .*replace=True"):
        reg.register("x", "another")(other)
    reg.register("x", "replaced", replace=True)(other)
    assert reg.get("x").factory is other


BAD = """
import sys

import fedrift
from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, HookReturnError
from fedrift.algorithms.terms import ce_loss


def make(kind):
    def local_loss(params, batch, payload, ctx, apply):
        ce, aux = ce_loss(params, batch, payload, ctx, apply)
        return ce if kind == "bare" else (ce, {"term": 0.5})

    return lambda hp, setup: Algorithm(name=f"bad_{kind}", hparams=hp, local_loss=local_loss)


for kind in ("bare", "float"):  # at module level: processes workers (forked from a server that imported it) see them
    ALGORITHMS.register(f"bad_{kind}", "a broken local_loss", AlgorithmParams)(make(kind))

if __name__ == "__main__":
    for name, executor in [(f"bad_{k}", e) for k in ("bare", "float") for e in ("sequential", "batched", "processes")]:
        cfg = {"data": {"name": "digits"}, "model": {"name": "mlp", "hidden": [16]},
               "partition": {"num_clients": 4, "min_size": 5}, "algorithm": {"name": name},
               "train": {"rounds": 1, "clients_per_round": 2, "local_epochs": 1},
               "engine": {"executor": executor, "workers": 2}, "output": {"dir": sys.argv[1] + name + executor, "progress": False}}
        try:
            fedrift.run(cfg)
        except HookReturnError as err:
            print(f"{name}: {err}")
"""


@pytest.mark.process
def test_a_wrong_local_loss_return_gets_one_message_under_every_executor(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(BAD)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "r")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for kind, expect in [
        ("bare", "algorithm bad_bare: hook local_loss returned a Tensor; expected (loss, aux)"),
        ("float", "algorithm bad_float: hook local_loss returned aux['term'], a float; expected (loss, aux)"),
    ]:
        lines = [x for x in proc.stdout.splitlines() if x.startswith(f"bad_{kind}: ")]
        assert len(lines) == 3 and len(set(lines)) == 1, proc.stdout  # refused under all three, one message
        assert lines[0].removeprefix(f"bad_{kind}: ").startswith(expect)
