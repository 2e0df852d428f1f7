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
    algorithms = "".join(p.read_text() for p in (site / "reference" / "algorithms").glob("*.html"))
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


def test_the_lab_notebook_is_a_page_per_section_and_no_page_is_huge(site):
    """Issue 72 item 6: the lab notebook was one page of 840 KB that many pages link to. Each
    ``## `` section of BENCHMARKS.md has its page (titled by it, listed on the contents page),
    and no page of the site is over 200 KB."""
    from test_docs_notebook import notebook, outside_code

    text = (ROOT / "BENCHMARKS.md").read_text()
    titles = [line[3:].strip() for line, prose in outside_code(text) if prose and line.startswith("## ")]
    _, sections = notebook.split(text)
    assert [s.title for s in sections] == titles and len(titles) >= 20
    contents = (site / "results" / "notebook.html").read_text()
    for s in sections:
        page = site / "results" / "notebook" / f"{s.name}.html"
        assert page.is_file(), f"section {s.title!r} has no page"
        assert f'href="notebook/{s.name}.html"' in contents, f"section {s.title!r} is not on the contents page"
        heading = re.search(r"<h1>(.*?)<a class=\"headerlink\"", page.read_text(), re.S)
        shown = " ".join(html.unescape(re.sub(r"<[^>]+>", "", heading.group(1))).split())
        assert shown == " ".join(s.title.replace("`", "").replace("'", "\u2019").split()), (shown, s.title)
    sizes = {p.relative_to(site).as_posix(): p.stat().st_size for p in site.rglob("*.html")}
    assert not {k: v for k, v in sizes.items() if v > 200_000}, "pages over 200 KB"
    assert sizes["results/notebook.html"] < 60_000


# The algorithms reference: prose with rendered maths (issue 72, item 6a), not docstrings in
# monospace blocks with raw reST, ASCII maths, cut-off lines and internal notes.

ALGORITHM_PAGES = ["reference/algorithms.html", *(f"reference/algorithms/{p.stem}.html" for p in
                                                  sorted((ROOT / "docs" / "reference" / "algorithms").glob("*.md")))]
RAW_REST = re.compile(r"``|:(math|class|func|meth|mod|attr|obj|data|ref|doc|exc):`")
INTERNAL = re.compile(r"\bissues? #?\d+|\bsessions?\b|\bdocstrings?\b|ALGORITHMS\.md|BENCHMARKS\.md|\bpapers/\d",
                      re.I)
MATH = 'class="math notranslate nohighlight"'  # Sphinx's maths markup, which MathJax typesets


def _article(page: str) -> str:
    return page.split("<article", 1)[1].split("</article>", 1)[0]


def _shown(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def test_the_algorithm_pages_are_prose_with_rendered_maths(site):
    """No monospace block (a fenced docstring, lines cut off on the right), no raw reST or
    Markdown markup, no internal notes; maths as Sphinx's maths markup, typeset by the MathJax
    the site serves itself (nothing fetched when the page is viewed)."""
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file(), "the site does not serve MathJax"
    for name in ALGORITHM_PAGES:
        page = (site / name).read_text()
        article = _article(page)
        text = _shown(article)
        assert "<pre" not in article, f"{name}: a monospace block"
        assert not RAW_REST.search(text), f"{name}: raw reST: {RAW_REST.search(text).group(0)!r}"
        tick = text.find("`")
        assert tick < 0, f"{name}: a raw backtick: ...{text[max(0, tick - 60):tick + 60]}..."
        found = INTERNAL.search(text)
        assert not found, f"{name}: an internal note: ...{text[max(0, found.start() - 80):found.end() + 40]}..."
        assert MATH in article, f"{name}: no maths"
        scripts = re.findall(r'<script[^>]* src="([^"]+)"', page)
        assert any(re.fullmatch(r"(\.\./)*_static/mathjax/tex-chtml\.js", s) for s in scripts), scripts
        assert not [s for s in scripts if "://" in s], f"{name}: a script from elsewhere: {scripts}"


def test_every_algorithm_has_a_section_with_its_paper_and_maths(site):
    """Each registered algorithm's section (its options and tuning space, generated) sits in a
    family section that names the paper and writes the method as maths."""
    from fedrift.algorithms import ALGORITHMS

    pages = {name: (site / name).read_text() for name in ALGORITHM_PAGES[1:]}
    for entry in [e for e in ALGORITHMS if e.source == "built in"]:
        anchor = f'id="algorithm-{entry.name.replace("_", "-")}"'
        where = [name for name, page in pages.items() if anchor in page]
        assert len(where) == 1, f"algorithm {entry.name}: a section on {where or 'no page'}"
        page = pages[where[0]]
        family = page[page[:page.index(anchor)].rindex("<h2"):page.index(anchor)]
        assert re.search(r"Papers?\.", _shown(family)), f"{entry.name}: its family section names no paper"
        assert MATH in family, f"{entry.name}: its family section has no maths"
        options = getattr(entry.params, "__pydantic_fields__", {})
        following = page.find('id="algorithm-', page.index(anchor) + len(anchor))
        section = page[page.index(anchor):following if following > 0 else None]
        for option in options:
            cell = f'<code class="docutils literal notranslate"><span class="pre">{option}</span></code>'
            assert cell in section, f"{entry.name}: option {option} is not in its table"


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


MATH_PROBE = """<script>
window.addEventListener("load", function () {
  var report = function (error) {
    var main = document.querySelector("article");
    var out = {error: error ? String(error) : null, math: main.querySelectorAll(".math").length,
               typeset: main.querySelectorAll("mjx-container").length, bad: [], wide: []};
    if (window.MathJax && MathJax.startup && MathJax.startup.document) {
      Array.from(MathJax.startup.document.math).forEach(function (m) {
        if (/merror|mathcolor="red"/.test(MathJax.startup.toMML(m.root))) out.bad.push(m.math.trim());
      });
    }
    main.querySelectorAll(".math-wrapper").forEach(function (w) {
      if (w.scrollWidth > w.clientWidth + 1) out.wide.push(w.textContent.trim().slice(0, 100));
    });
    var pre = document.createElement("pre");
    pre.id = "probe";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  };
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(function () { report(null); }, report);
  } else { report("no MathJax on the page"); }
});
</script>
"""


def test_the_algorithm_pages_typeset_their_maths(site, tmp_path):
    """In a browser that reaches nothing but the site's files, MathJax typesets every maths
    element of the algorithm pages, none with a TeX error (an undefined macro shows red, a
    malformed one as an error box), and no display equation is wider than the page's column
    at 1280 pixels (it would have to scroll). One browser start: the pages' articles in one
    family page's frame (its styles and MathJax)."""
    import json

    from report.test_html_browser import run_browser

    shell = site / ALGORITHM_PAGES[1]
    page = shell.read_text()
    articles = "".join(_article((site / name).read_text()).split(">", 1)[1] for name in ALGORITHM_PAGES)
    start = page.index("<article")
    start = page.index(">", start) + 1
    combined = page[:start] + articles + page[page.index("</article>"):]
    probe = shell.with_name("_probe_maths.html")  # beside the family pages: _static resolves
    probe.write_text(combined.replace("</body>", MATH_PROBE + "</body>"))
    try:
        proc = run_browser(["--dump-dom", "--virtual-time-budget=20000", "--window-size=1280,1600", probe.as_uri()],
                           tmp_path)
    finally:
        probe.unlink()
    found = re.search(r'<pre id="probe">([^<]*)</pre>', proc.stdout)
    assert found, (proc.stdout[-1000:], proc.stderr[-2000:])
    seen = json.loads(html.unescape(found.group(1)))
    expected = sum(_article((site / name).read_text()).count(MATH) for name in ALGORITHM_PAGES)
    assert seen["error"] is None and seen["math"] == expected and seen["typeset"] == expected, (expected, seen)
    assert not seen["bad"], f"TeX errors in {seen['bad']}"
    assert not seen["wide"], f"equations wider than the column: {seen['wide']}"
