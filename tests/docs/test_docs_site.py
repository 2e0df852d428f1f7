"""The docs site builds strictly (``make docs``'s options: every warning fails, nitpicky
references) from this tree, offline, and its pages hold what they are for."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # a cluster, a federation, a browser or a docs build: left out of make check

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``make docs``'s build, with the results figures to draw again and a new matplotlib font
    cache: the two steps that printed lines under -q (issue 72)."""
    out = tmp_path_factory.mktemp("docs") / "html"
    for png in (ROOT / "docs" / "_generated" / "figures").glob("*.png"):
        os.utime(png, (0, 0))  # older than the runs: the build draws them
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path_factory.mktemp("matplotlib"))}
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q",
                           "-d", str(out.parent / "doctrees"), str(ROOT / "docs"), str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"make docs would fail:\n{proc.stderr[-6000:]}"
    return out, proc


@pytest.fixture(scope="module")
def site(build) -> Path:
    return build[0]


def test_the_quiet_build_prints_nothing(build):
    """Under -q a build that passes -W prints nothing: no figure paths, no INFO line of a
    library (matplotlib's font cache, once the theme's accessible-pygments set INFO)."""
    _, proc = build
    assert proc.stdout == "", proc.stdout[-2000:]
    assert proc.stderr == "", proc.stderr[-2000:]


def test_the_makefile_builds_as_this_test_does():
    makefile = (ROOT / "Makefile").read_text()
    assert "-m sphinx -b html -n -W --keep-going" in makefile.split("\ndocs:", 1)[1].split("\n\n", 1)[0]


def test_every_page_is_built_and_in_the_navigation(site):
    sources = [p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md")
               if not {"_generated", "_build"} & set(p.relative_to(ROOT / "docs").parts)]
    for src in sources:
        assert (site / src.with_suffix(".html")).is_file(), f"{src}: no page built"
    home = (site / "index.html").read_text()
    for section in ("getting-started", "tutorials/index", "howto/index", "concepts/index", "reference/index", "results/index"):
        assert f'href="{section}.html"' in home, f"the home page does not route to {section}"


def test_the_reference_pages_are_generated_from_the_code(site):
    from fedrift.algorithms import ALGORITHMS
    from fedrift.cli import _parser
    from fedrift.config import Config

    config = (site / "reference" / "config.html").read_text()
    rounds = Config.model_fields["train"].annotation.model_fields["rounds"]
    rows = [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", row)).split()) for row in re.findall(r"<tr.*?</tr>", config, re.S)]
    row = next(r for r in rows if r.startswith("train.rounds "))
    assert row.startswith(f"train.rounds int {rounds.default} >= 1 {rounds.description}"), row
    algorithms = (site / "reference" / "algorithms.html").read_text()
    for name in [entry.name for entry in ALGORITHMS if entry.source == "built in"]:  # not a plugin loaded here
        assert f'id="algorithm-{name.replace("_", "-")}"' in algorithms, f"algorithm {name} has no section"
    cli = (site / "reference" / "cli.html").read_text()
    commands = [a for a in _parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)][0].choices
    for name in commands:
        assert f"fedrift {name}" in cli, f"fedrift {name} is not on the CLI page"


def test_the_site_shows_fedrift_s_version(site):
    """conf.py's release is src/fedrift/version.py's __version__, and the theme shows it."""
    from fedrift.version import __version__

    home = (site / "index.html").read_text()
    assert f"fedrift {__version__}" in home, "the index page does not show the version"
    assert f"<title>fedrift {__version__}</title>" in home


def test_the_examples_page_lists_every_example_and_paper_study(site):
    page = html.unescape((site / "reference" / "examples.html").read_text())
    files = sorted(p.relative_to(ROOT).as_posix() for p in
                   [*(ROOT / "examples").glob("*.yaml"), *(ROOT / "examples" / "papers").rglob("*.yaml")])
    assert any(f.endswith(".study.yaml") for f in files)
    for file in files:
        assert file in page, f"{file} is not on the examples page"
    assert 'href="examples.html"' in (site / "reference" / "index.html").read_text(), "not in the reference's toctree"


def test_the_changelog_is_on_the_site(site):
    page = html.unescape((site / "changelog.html").read_text())
    assert "Unreleased" in page and "0.1.0" in page and "--trust-plugins" in page
    assert 'href="changelog.html"' in (site / "index.html").read_text()


def test_the_results_page_shows_the_orderings_and_its_figures(site):
    page = (site / "results" / "index.html").read_text()
    assert "FedADC+ &gt; FedADC" in page and "FedGKD &gt; FedAvg" in page  # the orderings table, from BENCHMARKS.md
    images = re.findall(r'<img [^>]*src="([^"]+\.png)"', page)
    assert len(images) >= 3
    for src in images:
        png = (site / "results" / src).resolve()
        assert png.is_file() and png.stat().st_size > 10_000, f"figure {src} missing or empty"


# ---------------------------------------------------------------------------------------
# Looked at in a real headless browser (Debian's chromium, as tests/report/test_html_browser.py)

PAGES = {  # page: the least it must show (figures decoded, words of text in its article)
    "index.html": (0, 150),
    "tutorials/reproduce-a-paper.html": (0, 300),
    "reference/config.html": (0, 1500),
    "results/index.html": (4, 300),
}
PROBE = """<script>
window.addEventListener("load", function () {
  var main = document.querySelector("article") || document.body;
  var imgs = Array.from(main.querySelectorAll("img"));
  var out = {words: main.innerText.split(/\\s+/).filter(Boolean).length, imgs: imgs.length,
             decoded: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
             shown: imgs.filter(function (i) { return i.getBoundingClientRect().width > 200; }).length,
             title: document.title};
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


@pytest.mark.parametrize("page", list(PAGES))
def test_the_page_renders_with_its_text_and_figures(site, page, tmp_path):
    import json

    from report.test_html_browser import run_browser

    built = site / page
    probe = built.with_name("_probe_" + built.name)  # beside it: its styles and figures resolve
    probe.write_text(built.read_text().replace("</body>", PROBE + "</body>"))
    proc = run_browser(["--dump-dom", "--virtual-time-budget=10000", probe.as_uri()], tmp_path)
    found = re.search(r'<pre id="probe">([^<]*)</pre>', proc.stdout)
    assert found, (proc.stdout[-1000:], proc.stderr[-2000:])
    seen = json.loads(found.group(1))
    images, words = PAGES[page]
    assert seen["words"] >= words, seen
    assert seen["imgs"] >= images and seen["decoded"] == seen["imgs"] and seen["shown"] == seen["imgs"], seen
    assert "fedrift" in seen["title"]


@pytest.mark.parametrize("page", list(PAGES))
def test_the_screenshot_is_not_blank(site, page, tmp_path):
    from matplotlib.image import imread

    from report.test_html_browser import run_browser

    shot = tmp_path / "shot.png"
    proc = run_browser([f"--screenshot={shot}", "--window-size=1280,1600", (site / page).as_uri()], tmp_path)
    assert shot.is_file(), proc.stderr[-2000:]
    img = imread(shot)[..., :3]
    assert img.shape[:2] == (1600, 1280)
    dark = img.max(axis=-1) < 0.35  # text
    assert int(dark.sum()) > 20_000, f"{page}: the screenshot shows almost no text"
    if PAGES[page][0]:
        colourful = (img.max(axis=-1) - img.min(axis=-1)) > 0.3  # the figures' coloured lines and points
        assert int(colourful.sum()) > 2_000, f"{page}: no figure in view"
