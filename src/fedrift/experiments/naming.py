"""Names of an experiment's folders and labels: a value as it reads in a label, a label as a safe
folder name (long ones shortened with a hash of the whole, so two labels never share a folder)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any


def fmt_value(value: Any) -> str:
    """``0.1`` -> ``0.1``, ``[64, 64]`` -> ``[64,64]``, text as it is."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def safe_name(text: str, limit: int = 120) -> str:
    """``fedprox:mu=0.1 alpha=0.5`` -> ``fedprox_mu=0.1_alpha=0.5``: letters, digits and ``._=+-``."""
    name = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("._") or "run"
    if len(name) > limit:
        name = name[: limit - 9] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return name


__all__ = ["fmt_value", "safe_name"]
