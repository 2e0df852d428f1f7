"""report.html in a real headless browser (Debian's chromium; `make test` installs it).

The screenshot must exist, have the window's size and show something (not a blank page);
the DOM after load must hold the results table's rows and every figure decoded.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from matplotlib.image import imread

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
    assert seen["imgs"] == 4 and seen["decoded"] == 4 and seen["shown"] == 4
