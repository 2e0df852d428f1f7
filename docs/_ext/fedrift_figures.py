"""Sphinx extension: draw the results page's figures (``results/figures.py``) when the build
starts, unless they are newer than every committed run they are drawn from (and than the code
that draws them); and load ``fedrift_notebook``, the lab notebook's pages, one per section."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("docs_results_figures", HERE / "results" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stale(figures: Any, out: Path) -> bool:
    """True when a figure is missing or older than a file of the runs or the script."""
    pngs = [out / f"{name}.png" for name in figures.CURVES] + [out / "paired-gaps.png"]
    if not all(p.is_file() for p in pngs):
        return True
    oldest = min(p.stat().st_mtime for p in pngs)
    folders = {figures.RESULTS / f for f in figures.CURVES.values()} | {figures.RESULTS / g[1] for g in figures.GAPS}
    code = [Path(figures.__file__), figures.ROOT / "src" / "fedrift" / "report" / "plots.py"]  # and how it draws
    sources = code + [p for f in folders for p in f.rglob("*") if p.is_file()]
    return any(p.stat().st_mtime > oldest for p in sources)


def _on_builder_inited(app: Any) -> None:
    from sphinx.util import logging

    figures = _script()
    if stale(figures, figures.OUT):
        drawn = figures.draw(figures.OUT)  # said by sphinx's log: nothing under make docs -q
        logging.getLogger(__name__).info(f"fedrift_figures: drew {len(drawn)} figures in {figures.OUT}")


def setup(app: Any) -> dict[str, Any]:
    app.setup_extension("fedrift_notebook")  # the lab notebook's section pages (results/notebook/)
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "version": "1"}
