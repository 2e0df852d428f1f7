"""The lab notebook (BENCHMARKS.md) on the site a page per section (issue 72 item 6: it was one
page of 840 KB): ``docs/_ext/fedrift_notebook.py`` writes the pages when the build starts. The
built site's pages are checked in test_docs_site.py (a build); here, what the extension writes."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fedrift_notebook", ROOT / "docs" / "_ext" / "fedrift_notebook.py")
notebook = sys.modules.setdefault("fedrift_notebook", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(notebook)


def outside_code(text: str) -> list[tuple[str, bool]]:
    """Each line, and whether it lies outside fenced code (found here on their own)."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r" *(```|~~~)", line)
        if m and fence in (None, m.group(1)):
            fence = m.group(1) if fence is None else None
            out.append((line, False))
        else:
            out.append((line, fence is None))
    return out


def test_every_section_has_its_page_with_its_text(tmp_path):
    pages, contents = tmp_path / "notebook", tmp_path / "contents.md"
    written = notebook.write(ROOT / "BENCHMARKS.md", pages, contents)
    text = (ROOT / "BENCHMARKS.md").read_text()
    titles = [line[3:].strip() for line, prose in outside_code(text) if prose and line.startswith("## ")]
    assert len(titles) >= 20 and len(written) == len(titles) == len(set(written))
    assert sorted(pages.glob("*.md")) == sorted(written)
    listed = contents.read_text()
    rebuilt = []
    for title, page in zip(titles, written):
        lines = page.read_text().splitlines()
        assert lines[0] == f"# {title}", page.name  # the section's title is the page's
        assert f"(/results/notebook/{page.name})" in listed and f"/results/notebook/{page.stem}\n" in listed
        start = next(i for i, line in enumerate(lines) if line.startswith("A section of the [lab notebook]"))
        body = "\n".join(lines[start + 1:])
        rebuilt += [f"## {title}"] + [f"#{line}" if prose and re.match(r"#{2,5} ", line) else line
                                      for line, prose in outside_code(body)]
    # the pages hold the sections' text whole, each heading one level up (none lost, none added)
    sections = text[text.index(f"## {titles[0]}"):].splitlines()
    assert [line for line in rebuilt if line.strip()] == [line for line in sections if line.strip()]


def test_a_section_gone_loses_its_page_and_an_unchanged_page_is_not_rewritten(tmp_path):
    source = tmp_path / "BENCHMARKS.md"
    source.write_text("# Benchmarks\n\nIntro.\n\n## A. First (issue 1)\n\n### Sub\n\n```\n## not a section\n```\n\n"
                      "## B. Second: more\n\nText.\n")
    pages, contents = tmp_path / "notebook", tmp_path / "contents.md"
    mine = pages / "kept.md"
    pages.mkdir()
    mine.write_text("# Not generated\n")
    first = notebook.write(source, pages, contents)
    assert [p.name for p in first] == ["a-first.md", "b-second.md"]
    assert "## Sub\n" in first[0].read_text() and "```\n## not a section\n```" in first[0].read_text()
    assert "Intro." in contents.read_text() and "(1 subsection, " in contents.read_text()
    os.utime(first[1], (0, 0))
    source.write_text(source.read_text().split("## B.")[0])
    assert notebook.write(source, pages, contents) == first[:1]
    assert not first[1].exists() and mine.is_file()  # the gone section's page removed; another file kept
    source.write_text(source.read_text() + "## B. Second: more\n\nText.\n")
    notebook.write(source, pages, contents)
    os.utime(first[1], (0, 0))
    notebook.write(source, pages, contents)
    assert first[1].stat().st_mtime == 0  # unchanged: not written again (Sphinx reads it again only if changed)
