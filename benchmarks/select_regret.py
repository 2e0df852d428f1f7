"""Issue 34 item 4: a select's regret against a full table's best method, paired by seed.

    .venv/bin/python benchmarks/select_regret.py PICK_DIR BEST_DIR

PICK_DIR: the pick's runs in a `fedrift select --out` folder (confirm/<entry>, at the
confirmation's seeds); BEST_DIR: the full table's best entry at its tuned values, run by
`fedrift compare` at the same seeds (benchmarks/select_regret.sh). Prints each one's test
accuracy (at the best validation round, and final) and the regret, pick - best, paired by
seed: the mean +- the half-width of the 95% Student t interval, in points.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scipy import stats


def runs(folder: Path) -> dict[int, dict]:
    """{seed: summary.json} of a setting's folder (seed1, seed2 ...)."""
    return {int(p.name[4:]): json.loads((p / "summary.json").read_text())
            for p in sorted(folder.glob("seed*")) if (p / "summary.json").is_file()}


def paired(a: dict[int, dict], b: dict[int, dict], key: str) -> tuple[float, float, int]:
    """Mean and 95% t half-width of ``100 (a - b)`` over the seeds both hold."""
    d = [100 * (a[s][key] - b[s][key]) for s in sorted(set(a) & set(b))]
    n, mean = len(d), sum(d) / len(d)
    if n < 2:
        return mean, float("nan"), n
    sd = (sum((x - mean) ** 2 for x in d) / (n - 1)) ** 0.5
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / n ** 0.5, n


def main(pick_dir: str, best_dir: str) -> None:
    pick, best = runs(Path(pick_dir)), runs(Path(best_dir))
    print(f"pick {Path(pick_dir).name} seeds {sorted(pick)}; best {Path(best_dir).name} seeds {sorted(best)}")
    for key in ("test_accuracy_at_best_val", "final_accuracy"):
        mean, half, n = paired(pick, best, key)
        p = sum(100 * r[key] for r in pick.values()) / len(pick)
        b = sum(100 * r[key] for r in best.values()) / len(best)
        print(f"{key}: pick {p:.1f}, best {b:.1f}, regret {mean:+.1f} +- {half:.1f} ({n} paired seeds)")


if __name__ == "__main__":
    main(*sys.argv[1:])
