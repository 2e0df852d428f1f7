"""Sphinx configuration of fedrift's documentation (make docs; make docs-serve).

Markdown pages (MyST) in the furo theme, as Flower's, Optuna's and Ray's sites are built.
The reference pages include files that ``_ext/fedrift_reference.py`` generates from the code
when the build starts (the examples page: ``_ext/fedrift_examples.py``, from ``examples/``),
and the results page's figures are drawn by ``results/figures.py`` from the committed runs, so
none can drift from what they describe. Nothing is fetched:
the build runs offline.
"""

import logging
import sys
from pathlib import Path

# Python's default for loggers outside sphinx (warnings only, to stderr), made explicit: the
# theme's accessible-pygments calls logging.basicConfig(level=INFO) when imported, which would
# print other libraries' INFO lines (matplotlib's font cache) under make docs -q.
if not logging.root.handlers:
    logging.root.addHandler(logging.lastResort)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "fedrift"
author = "the fedrift authors"
copyright = "the fedrift authors, Apache-2.0"


def _fedrift_version() -> str:
    """``__version__`` of src/fedrift/version.py, read from the file: importing ``fedrift.version``
    would import the package (torch and every layer) first."""
    import ast

    tree = ast.parse((HERE.parent / "src" / "fedrift" / "version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("src/fedrift/version.py has no __version__")


release = _fedrift_version()
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx-mathjax-offline", "fedrift_reference", "fedrift_examples", "fedrift_figures"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "README.md", "**/*-prose.md", "index-intro.md"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath"]  # $...$, $$...$$: MathJax, served from _static (sphinx-mathjax-offline)
html_theme = "furo"
html_title = f"fedrift {release}"
html_static_path = []
# Strict: every cross-reference must resolve (make docs adds -n -W --keep-going).
nitpicky = True
# autodoc: signatures as written; the types are named in the docstrings.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
# Internal modules and functions that public docstrings point to for detail; they are not part
# of the API page (the Python API is the names ``fedrift`` exports).
nitpick_ignore = [
    ("py:func", "fedrift.engine.loop.run_federation"),
    ("py:mod", "fedrift.report.table"),
    ("py:mod", "fedrift.report.paired"),
    ("py:func", "apply_overrides"),
]
