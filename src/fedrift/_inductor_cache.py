"""A folder of its own for ``torch.compile``'s CPU kernels under ``ATEN_CPU_CAPABILITY``.

inductor (``engine.compile``) picks its CPU kernels' vector width by ``ATEN_CPU_CAPABILITY``,
as ATen does, but its cache on disk does not tell the widths apart (torch 2.13): on an
AVX-512 Xeon, a run under ``ATEN_CPU_CAPABILITY=avx2`` after runs at the machine's own width
took their cached kernels and gave non-finite losses in its first round (the reverse crashed
the process). So where the variable is set and ``TORCHINDUCTOR_CACHE_DIR`` is not, a process
that imports fedrift compiles into ``<tmp>/torchinductor_<user>_<capability>``. Set at import,
before torch's compiler is loaded: switched later, inductor's parts already loaded keep the
shared folder and mix the two (seen: the same non-finite losses). Where torch's compiler was
loaded first, nothing is changed.
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from typing import MutableMapping


def separate(environ: MutableMapping[str, str] = os.environ, modules: dict = sys.modules) -> str | None:
    """Point ``TORCHINDUCTOR_CACHE_DIR`` at the capability's own folder where it applies;
    the folder, or None where nothing was changed."""
    capability = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if not capability or "TORCHINDUCTOR_CACHE_DIR" in environ or "torch._inductor" in modules:
        return None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{capability}")
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder
