"""fedrift keeps a process's freed blocks for its next allocation on glibc (``fedrift/_malloc.py``):
a loop that frees and allocates 64 MiB again faults its pages in once, not every time."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

# 4 blocks of 16 MiB touched, freed, again, 20 times; prints the setting's outcome and the
# minor page faults the loop took (64 MiB is 16,384 pages of 4 KiB). IMPORT: the package as a
# user imports it, or (cheaper: no torch) the module file alone.
LOOP = """
import ctypes, importlib.util, resource, sys
if IMPORT == "package":
    import fedrift._malloc as m
else:
    spec = importlib.util.spec_from_file_location("fedrift_malloc", IMPORT)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
applied = m.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 16 << 20
def once():
    blocks = [libc.malloc(size) for _ in range(4)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks:
        libc.free(b)
once()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    once()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
GLIBC = platform.libc_ver()[0] == "glibc"
MODULE = str(Path(__file__).resolve().parents[1] / "src" / "fedrift" / "_malloc.py")


def _loop(package: bool = False, **env: str) -> tuple[bool, int]:
    base = {k: v for k, v in os.environ.items() if k != "FEDRIFT_MALLOC" and not k.startswith("MALLOC_")}
    code = f"IMPORT = {'package' if package else MODULE!r}\n" + LOOP
    proc = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    applied, faults = proc.stdout.split()
    return applied == "True", int(faults)


@pytest.mark.process
def test_freed_blocks_are_reused_not_faulted_in_again():
    applied, faults = _loop(package=True)  # import fedrift applies it
    assert applied == GLIBC
    if GLIBC:  # glibc's defaults give the 64 MiB back each time: about 20 x 16,384 faults
        off, default_faults = _loop(FEDRIFT_MALLOC="default")
        assert not off and default_faults > 20 * 16384 // 2
        assert faults < 16384 // 4, (faults, default_faults)


@pytest.mark.process
def test_the_users_own_glibc_settings_and_the_opt_out_are_kept():
    assert _loop(MALLOC_TRIM_THRESHOLD_="131072")[0] is False
    assert _loop(MALLOC_MMAP_THRESHOLD_="131072")[0] is False
    assert _loop(FEDRIFT_MALLOC="default")[0] is False
