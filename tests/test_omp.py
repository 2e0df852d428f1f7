"""fedrift sets OpenMP's passive wait policy before torch loads, so concurrent runs share cores."""

import os
import subprocess
import sys

import pytest

SHOW = "import fedrift, os, torch; print(os.environ['OMP_WAIT_POLICY'])"


def _child(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    proc = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.process
def test_import_fedrift_sets_passive_wait_policy_and_keeps_the_users():
    assert _child(None) == "PASSIVE"
    assert _child("ACTIVE") == "ACTIVE"


WATCH = """
import os, sys
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
        return None
sys.meta_path.insert(0, Watch())
import fedrift.cli
print(seen[0])
"""


@pytest.mark.process
def test_the_policy_is_set_before_torch_is_first_imported():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run([sys.executable, "-c", WATCH], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "PASSIVE", proc.stderr
