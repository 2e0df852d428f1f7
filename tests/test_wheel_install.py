"""fedrift as a library outside a checkout (issue 72 item 6): the wheel ``pip install .`` builds,
installed into a fresh virtual environment, runs from a folder that is not the checkout.

Cheap and honest: the wheel is built as ``pip install .`` builds it (pyproject's backend,
setuptools), from a copy of the files it is built from; the fresh environment is a new
``venv`` whose dependencies are this environment's installed packages, seen through a plain
path line in a ``.pth`` file (which adds the folder to ``sys.path`` but runs none of its own
``.pth`` files: the editable fedrift there stays invisible), so nothing is downloaded. The
test checks that the fedrift imported is the wheel's, and that every requirement the wheel
declares is met by what the fresh environment sees.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import tiny_config
from fedrift.version import __version__

pytestmark = pytest.mark.process  # builds a wheel and runs the installed fedrift

ROOT = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_files() -> list[str]:
    """The files of src/fedrift a build takes: git's (tracked, or new and not ignored), else every
    file but the byte-code caches (a checkout without git)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "src/fedrift"],
                             cwd=ROOT, capture_output=True, check=True, timeout=60).stdout.decode()
        files = [f for f in out.split("\0") if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "src" / "fedrift").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files)


def run(args: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, **kw)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_the_wheel_installs_in_a_fresh_environment_and_runs_outside_the_checkout(tmp_path):
    backend = re.search(r'^build-backend\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert backend and backend[1] == "setuptools.build_meta"  # what pip wheel runs below, without isolation

    # 1. The wheel, built from a copy of what it is built from: an in-tree build would leave build/
    #    and an egg-info in the checkout, and pack any stale file a former build left in build/lib.
    tree = tmp_path / "tree"
    files = package_files()
    for rel in ["pyproject.toml", "README.md", *files]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tree / rel)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--disable-pip-version-check", "-w", tmp_path / "dist", tree])
    wheels = list((tmp_path / "dist").glob("fedrift-*.whl"))
    assert [w.name for w in wheels] == [f"fedrift-{__version__}-py3-none-any.whl"]
    wheel = wheels[0]

    # 2. What it holds: every file of the package (modules and anything the code reads beside
    #    them), the command, the version and the requirements.
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"fedrift-{__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    missing = [f for f in files if f.removeprefix("src/") not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert any(f.endswith(".py") for f in files) and "fedrift/version.py" in names
    assert re.search(r"^fedrift = fedrift\.cli:main$", entry_points, re.M)
    assert metadata["Name"] == "fedrift" and metadata["Version"] == __version__
    required = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    core = [r for r in required if not (r.marker and "extra" in str(r.marker))]
    assert {canonical(r.name) for r in core} >= {"torch", "numpy", "pydantic", "pyyaml", "matplotlib"}

    # 3. A fresh environment: a new venv without pip, this environment's packages on its path (a
    #    plain path line: no .pth of theirs runs, so not the editable fedrift), the wheel alone
    #    installed into it by this environment's pip, nothing fetched.
    fresh = tmp_path / "fresh"
    run([sys.executable, "-m", "venv", "--without-pip", fresh])
    python = fresh / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    deps = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    (site / "_deps_from_the_test_environment.pth").write_text("".join(f"{d}\n" for d in deps))
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q",
         "--disable-pip-version-check", wheel])

    # 4. From a folder outside the checkout, without the test's PYTHONPATH: the command and a run
    #    through the Python API (embedded data, 2 rounds).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    shown = run([fresh / "bin" / "fedrift", "--version"], cwd=elsewhere, env=env).stdout
    assert shown.strip() == f"fedrift {__version__}"
    cfg = tiny_config(elsewhere, output={"dir": str(elsewhere / "runs" / "tiny"), "progress": False})
    (elsewhere / "tiny.json").write_text(json.dumps(cfg))
    script = """
import importlib.metadata as md, json, sys
import fedrift
result = fedrift.run(json.load(open("tiny.json")))
seen = {}
for d in md.distributions():  # the first of a name on sys.path, as import finds it
    seen.setdefault(d.metadata["Name"], d.version)
print(json.dumps({"file": fedrift.__file__, "path": sys.path, "best": result.summary["best_accuracy"],
                  "out": str(result.output_dir), "fedrift_at": str(md.distribution("fedrift").locate_file("")),
                  "seen": seen}))
"""
    out = json.loads(run([python, "-c", script], cwd=elsewhere, env=env).stdout.strip().splitlines()[-1])
    assert Path(out["file"]).is_relative_to(site), f"fedrift imported from {out['file']}, not the wheel's"
    assert Path(out["fedrift_at"]) == site
    assert str(ROOT / "src") not in out["path"] and "" not in out["path"][1:]
    assert (Path(out["out"]) / "summary.json").is_file() and Path(out["out"]).is_relative_to(elsewhere)
    assert 0.0 < out["best"] <= 1.0

    # 5. Every requirement of the wheel met by what the fresh environment sees.
    seen = {canonical(k): v for k, v in out["seen"].items()}
    unmet = [str(r) for r in core if (r.marker is None or r.marker.evaluate())
             and not (canonical(r.name) in seen and r.specifier.contains(seen[canonical(r.name)], prereleases=True))]
    assert not unmet, f"requirements the fresh environment does not meet: {unmet} (it sees {seen})"
