"""The run folder: config.yaml, partition.json, metrics.jsonl, summary.json, final_model.pt.

Metrics are appended and flushed after each evaluated round, so a run that stops (divergence,
Ctrl-C, a crash) keeps every line it wrote. An existing run is never overwritten unless asked.
"""

from __future__ import annotations

import json
import os
import math
import time
from pathlib import Path
from typing import Any

import torch

from fedrift.data.partition_base import Partition
from fedrift.errors import ConfigError

OWNED = ("config.yaml", "partition.json", "metrics.jsonl", "summary.json", "final_model.pt")


def auto_dir(base: Path, label: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = base / f"{label}-{stamp}"
    n = 2
    while path.exists():
        path = base / f"{label}-{stamp}-{n}"
        n += 1
    return path


class RunWriter:
    def __init__(self, out_dir: Path, overwrite: bool) -> None:
        if out_dir.exists() and not out_dir.is_dir():
            raise ConfigError(f"output.dir: {str(out_dir)!r} is a file, not a folder")
        held = [name for name in OWNED if (out_dir / name).exists()]
        if held and not overwrite:
            raise ConfigError(
                f"output.dir: {str(out_dir)!r} already holds a run ({held[0]}); "
                "choose another folder or set output.overwrite=true"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in held:
            (out_dir / name).unlink()
        self.dir = out_dir
        self._metrics = (out_dir / "metrics.jsonl").open("a")

    def write_text(self, name: str, text: str) -> None:
        (self.dir / name).write_text(text)

    def write_partition(self, partition: Partition) -> None:
        partition.save(self.dir / "partition.json")

    def log(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(_jsonable(row)) + "\n")
        self._metrics.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Atomically (written beside, then renamed): a run killed meanwhile leaves no torn file."""
        tmp = self.dir / "summary.json.tmp"
        tmp.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
        os.replace(tmp, self.dir / "summary.json")

    def save_model(self, state_dict: dict[str, torch.Tensor]) -> None:
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, self.dir / "final_model.pt")

    def close(self) -> None:
        self._metrics.close()


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf: write them as null rather than emit invalid JSON."""
    out = {}
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out
