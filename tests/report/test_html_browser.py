"""report.html and tune.html in a real headless browser (Debian's chromium; `make test` installs it).

The screenshot must exist, have the window's size and show something (not a blank page);
the DOM after load must hold the results table's rows and every figure decoded; in a
1400-pixel window neither page, nor any of its tables, scrolls sideways.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from matplotlib.image import imread

pytestmark = pytest.mark.process  # a cluster, a federation, a browser or a docs build: left out of make check

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--hide-scrollbars"]

PROBE = """<script>
window.addEventListener("load", function () {
  var imgs = Array.from(document.images);
  var t = document.getElementById("results");
  var out = {rows: t ? t.tBodies[0].rows.length : -1, imgs: imgs.length,
             decoded: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
             shown: imgs.filter(function (i) { return i.getBoundingClientRect().width > 100; }).length,
             first_cell: t ? t.tBodies[0].rows[0].cells[0].textContent : ""};
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no chromium found: this test needs a headless browser; install Debian's chromium "
                "(apt-get install -y --no-install-recommends chromium), as `make test` does where it may")


def run_browser(args, tmp_path):
    cmd = [browser(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_screenshot_shows_the_report(grid, tmp_path):
    root, _ = grid
    shot = tmp_path / "shot.png"
    proc = run_browser([f"--screenshot={shot}", "--window-size=1200,2000", (root / "report.html").as_uri()], tmp_path)
    assert shot.is_file(), proc.stderr[-2000:]
    img = imread(shot)[..., :3]
    assert img.shape[:2] == (2000, 1200)
    assert float(img.std()) > 0.05  # not a blank page
    colourful = (img.max(axis=-1) - img.min(axis=-1)) > 0.3  # the figures' coloured lines and points
    assert int(colourful.sum()) > 500
    dark = img.max(axis=-1) < 0.3  # text and table rules
    assert int(dark.sum()) > 5000


def test_rendered_dom_has_the_table_and_decoded_images(grid, tmp_path):
    root, rows = grid
    probe = tmp_path / "probe.html"  # a copy with a probe script; report.html itself has no script
    probe.write_text((root / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    proc = run_browser(["--dump-dom", "--virtual-time-budget=10000", probe.as_uri()], tmp_path)
    found = re.search(r'<pre id="probe">([^<]*)</pre>', proc.stdout)
    assert found, (proc.stdout[-1000:], proc.stderr[-2000:])
    seen = json.loads(found.group(1))
    assert seen["rows"] == len(rows) and seen["first_cell"] == rows[0]["setting"]
    assert seen["imgs"] == 6 and seen["decoded"] == 6 and seen["shown"] == 6  # with the worst 10% and per-client figures


WIDTH_PROBE = """<script>
window.addEventListener("load", function () {
  var tables = {};
  Array.from(document.querySelectorAll("table")).forEach(function (t) {
    tables[t.id] = {width: Math.ceil(t.getBoundingClientRect().width), room: t.parentElement.clientWidth};
  });
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify({inner: window.innerWidth, page: document.documentElement.scrollWidth, tables: tables});
  document.body.appendChild(pre);
});
</script>
"""


def widths(page, tmp_path, width=1280):
    """The window's width, the page's, and each table's width beside the room it has, as the
    browser lays the page out in a window ``width`` pixels wide."""
    probe = tmp_path / f"probe-{page.stem}.html"
    probe.write_text(page.read_text().replace("</body>", WIDTH_PROBE + "</body>"))
    proc = run_browser([f"--window-size={width},1000", "--dump-dom", "--virtual-time-budget=10000", probe.as_uri()],
                       tmp_path)
    found = re.search(r'<pre id="probe">([^<]*)</pre>', proc.stdout)
    assert found, (proc.stdout[-1000:], proc.stderr[-2000:])
    return json.loads(found.group(1))


def wide_grid(root):
    """Run folders for the widest results table fedrift writes: six methods, a validation split,
    local test splits and their worst 10%, three acc@ rounds, paired differences on five metrics
    (with report.metric=local_accuracy), a rank column, a paper's three columns and the seed
    papers' claims (24 columns)."""
    import yaml

    algorithms = ["fedavg", "fedprox", "moon", "fedgkd", "fedgkd_vote", "fedcsd"]
    for i, name in enumerate(algorithms):
        for seed in (0, 1):
            d = root / name / f"seed{seed}"
            d.mkdir(parents=True)
            cfg = {"seed": seed, "data": {"name": "digits"}, "algorithm": {"name": name},
                   "partition": {"name": "dirichlet", "alpha": 0.1, "num_clients": 100, "val_share": 0.1},
                   "train": {"rounds": 50, "clients_per_round": 20}, "output": {"dir": str(d)}}
            (d / "config.yaml").write_text(yaml.safe_dump(cfg))
            accs = [0.3 + 0.008 * r + 0.01 * i + 0.003 * seed for r in range(1, 51)]
            (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a}) + "\n"
                                                     for r, a in enumerate(accs, start=1)))
            (d / "summary.json").write_text(json.dumps({
                "status": "completed", "seed": seed, "rounds": 50, "best_accuracy": max(accs), "final_accuracy": accs[-1],
                "test_accuracy_at_best_val": accs[-2], "best_val_accuracy": accs[-2], "final_local_accuracy": accs[-1] - 0.1,
                "final_local_accuracy_worst10": accs[-1] - 0.25 - 0.01 * seed,
                "wall_seconds": 1234.5, "seconds_per_round": 24.69, "bytes_down_total": 50 * 44.36e6,
                "bytes_up_total": 50 * 33.27e6}))


def test_both_pages_fit_1280_pixels_without_scrolling_sideways(grid, tmp_path):
    """report.html (the widest table: 24 columns) and tune.html in a 1280-pixel window: the
    page and each table fit (a table's cells wrap, a number before its ±, rather than scroll)."""
    from fedrift.cli import main
    from fedrift.report.table import load_groups, summarize

    from conftest import tiny_config

    import fedrift

    runs = tmp_path / "wide"
    wide_grid(runs)
    assert main(["report", str(runs), "report.plots=false", "report.tsne=none", "report.at_rounds=10,20,50",
                 "report.paper=fedgkd-table3-cifar10", "report.claims=papers", "report.metric=local_accuracy"]) == 0
    columns = (runs / "results.md").read_text().splitlines()[0].count("|") - 1
    assert columns == 24 and len(summarize(load_groups(runs)[0])) == 6
    cfg = tiny_config(tmp_path, train={"rounds": 2}, partition={"val_share": 0.2})
    cfg.pop("output")
    tune = tmp_path / "tune"
    fedrift.tune(cfg, algorithms=["fedavg", "fedprox"], trials=2, out=tune, pruner="none", verbose=False)
    root, _ = grid
    for page, tables in ((runs / "report.html", ("results", "claims")), (root / "report.html", ("results",)),
                         (tune / "tune.html", ("summary", "trials-fedavg", "trials-fedprox"))):
        seen = widths(page, tmp_path)
        assert seen["inner"] == 1280 and seen["page"] <= seen["inner"], (page, seen)
        for t in tables:
            assert 0 < seen["tables"][t]["width"] <= seen["tables"][t]["room"], (page, t, seen["tables"])
    # it fits by wrapping its cells (a number before its ±, a size before its unit, a header after a /) in
    # smaller type (over 20 columns): on one line each, it would not
    html = (runs / "report.html").read_text()
    assert '<table id="results" class="fit dense">' in html and "70.2 ±&nbsp;0.2" in html
    assert "<td>44.36 MB</td>" in html and "<th>down/<wbr>round</th>" in html
