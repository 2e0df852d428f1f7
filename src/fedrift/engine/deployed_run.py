"""A Flower deployment's run folder: the file that marks it (``flower.json``, written by the
ServerApp, ``fedrift.deploy.flower``) and how such a run continues.

Here, below the run folder (``engine.outputs`` refuses to resume or reuse a deployed run's
folder) and the deployment (``fedrift.deploy``, which re-exports them), which the engine
does not import. No torch: ``fedrift.deploy.project`` imports nothing heavy of its own.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "flower.json"  # in a deployed run's folder: the Flower run it was (written first, so a killed run has it)
AGAIN = ("a deployed run keeps no checkpoints: submit the app again (flwr run APP SUPERLINK), into a new "
         "output.dir or with output.overwrite=true; it starts from round 1")


def deployed(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run a Flower ServerApp wrote."""
    return (run_dir / MARKER).is_file()
