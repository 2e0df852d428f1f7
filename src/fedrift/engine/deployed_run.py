"""A Flower deployment's run folder: the file that marks it (``flower.json``, written by the
ServerApp, ``fedrift.deploy.flower``) and how such a run continues.

Here, below the run folder (``engine.outputs`` refuses to resume or reuse a deployed run's
folder) and the deployment (``fedrift.deploy``, which re-exports them), which the engine
does not import. No torch: ``fedrift.deploy.project`` imports nothing heavy of its own.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "flower.json"  # in a deployed run's folder: the Flower run it was (written first, so a killed run has it)
# an app submitted again, over its run folder or into a new one, without rebuilding it (deploy/project.py)
RESUBMIT = ("flwr run APP SUPERLINK --run-config 'fedrift-overrides=\"output.overwrite=true\"' "
            "(or \"output.dir=/a/new/folder\")")
AGAIN = f"a deployed run keeps no checkpoints: submit the app again: {RESUBMIT}; it starts from round 1"


def deployed(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run a Flower ServerApp wrote."""
    return (run_dir / MARKER).is_file()
