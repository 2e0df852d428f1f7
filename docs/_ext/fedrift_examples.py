"""The examples page generated from the files in ``examples/``, so a new example appears by itself.

:func:`examples_page` reads every ``examples/*.yaml`` config and every file under
``examples/papers/`` (configs and ``*.study.yaml`` study files) with fedrift's YAML loader, and
writes one summary table (dataset, partition, model, algorithms, the paper reproduced, the cost)
and one section a file: the first paragraph of its header comment (the description), the
commands its header gives, and a measured time where the header states one or where
BENCHMARKS.md measures the file (a sentence naming the file's path with seconds in it, quoted
with its section). The paper is the published table a study's ``report.paper`` names (its base
config and the configs named after that table reproduce it too), else the design the header
names in parentheses ("FedGKD Table 3, scaled"). The cost is rounds x clients a round x local
epochs of a run; a study's is its number of runs (entries x seeds x swept settings) times that.

As a Sphinx extension it writes ``docs/_generated/examples.md`` when the build starts, as
``fedrift_reference`` writes the reference pages; ``python docs/_ext/fedrift_examples.py`` writes
it alone.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "BENCHMARKS.md"
GENERATED = Path(__file__).resolve().parents[1] / "_generated"

# A measured time as BENCHMARKS.md writes one: "87.3 s wall", "45 CPU seconds", "5.8 CPU s a round".
MEASURED = re.compile(r"\d[\d.,]*(?:-\d[\d.,]*)? (?:CPU |core-)?(?:s|seconds|minutes)\b(?: of (?:wall|a core))?"
                      r"(?: a round| wall| a run)?")
# A time a file's header states: "About 27 s on 2 CPU cores", "in about a minute on 2 CPU cores".
STATED = re.compile(r"(?:in )?about (?:\d[\d.,]* ?(?:s|seconds|minutes?|h|hours?)|a minute|an hour) on [^.;(]+", re.IGNORECASE)


def example_files(folder: Path = EXAMPLES) -> list[Path]:
    """Every example config and paper study: ``examples/*.yaml`` and ``examples/papers/**/*.yaml``."""
    return sorted(folder.glob("*.yaml")) + sorted((folder / "papers").rglob("*.yaml"))


def header(path: Path) -> list[str]:
    """The file's first comment lines (before its first key), ``#`` and one space removed."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" ").rstrip())
    return lines


def description(lines: list[str]) -> str:
    """The header's first paragraph: its lines up to the first blank or command line."""
    out = []
    for line in lines:
        if not line.strip() or line.startswith("  "):
            break
        out.append(line.strip())
    text = " ".join(out)
    return text[:-1] + "." if text.endswith(":") else text


def commands(lines: list[str]) -> list[str]:
    """The header's indented command lines (continuations joined to their command)."""
    out: list[str] = []
    for line in lines:
        if not line.startswith("  ") or not line.strip():
            continue
        text = line.split("  # ")[0].strip() if ".venv/bin" in line else line.strip()
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + text
        elif text.startswith((".venv/bin/", "fedrift ")) or out and text.startswith("algorithms="):
            out.append(text)
    return out


def _sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.;])\s+(?=[A-Z(`*])", text)


def _paragraphs(text: str) -> list[tuple[str, str]]:
    """(section heading, paragraph) of a Markdown text, code blocks left out."""
    out, heading, buf, fenced = [], "", [], False
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#") or not line.strip():
            if buf:
                out.append((heading, " ".join(buf)))
                buf = []
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            continue
        buf.append(line.strip())
    return out


def measured(path: Path, lines: list[str], benchmarks: str) -> str:
    """A measured time of ``path``: the header's own, else BENCHMARKS.md's first sentence that
    names the file and gives seconds (with its section); "" where neither does."""
    for sentence in _sentences(" ".join(line.strip() for line in lines)):
        found = STATED.search(sentence)
        if found:
            return f"{found.group(0).strip()} (the file's header)"
    rel = path.relative_to(ROOT).as_posix()
    paragraphs = [(heading, _sentences(para)) for heading, para in _paragraphs(benchmarks) if rel in para]
    for heading, sentences in paragraphs:  # the sentence that names the file
        for sentence in sentences:
            if rel in sentence and MEASURED.search(sentence):
                return f'BENCHMARKS.md, "{heading}": {_short(sentence)}'
    for heading, sentences in paragraphs:  # else a time a round in the paragraph that names it
        for sentence in sentences:
            found = MEASURED.search(sentence)
            if found and found.group(0).endswith(" a round"):
                return f'BENCHMARKS.md, "{heading}": {_short(sentence)}'
    return ""


def _short(sentence: str, limit: int = 400) -> str:
    sentence = " ".join(sentence.split())
    return sentence if len(sentence) <= limit else sentence[:limit].rsplit(" ", 1)[0] + " ..."


def _load(path: Path) -> dict[str, Any]:
    from fedrift.yamlio import load

    with path.open() as f:
        doc = load(f)
    return doc if isinstance(doc, dict) else {}


def _set(config: dict[str, Any], key: str, value: Any) -> None:
    section, _, name = key.partition(".")
    if name:
        config.setdefault(section, {})[name] = value
    else:
        config[section] = value


def _options(section: dict[str, Any], keys: tuple[str, ...]) -> str:
    name = f"`{section.get('name', '?')}`"
    shown = [f"{k} {section[k]}" for k in keys if k in section]
    return name + (f" ({', '.join(shown)})" if shown else "")


def _entry_names(entries: Any) -> list[str]:
    names = []
    for entry in entries or []:
        text = entry.get("entry", "") if isinstance(entry, dict) else str(entry)
        names.append(text.split(":", 1)[0])
    return list(dict.fromkeys(names))


def _header_algorithms(cmds: list[str]) -> list[str]:
    names: list[str] = []
    for cmd in cmds:
        for found in re.findall(r"(?:^|\s)algorithms=(\S+)", cmd):
            names.extend(part.split(":", 1)[0] for part in found.split(","))
    return list(dict.fromkeys(n for n in names if n))


def _cost(train: dict[str, Any]) -> tuple[str, int]:
    rounds, clients, epochs = train.get("rounds", "?"), train.get("clients_per_round", "?"), train.get("local_epochs", 1)
    work = rounds * clients * epochs if all(isinstance(v, int) for v in (rounds, clients, epochs)) else 0
    return f"{rounds} x {clients} x {epochs}", work


def _paper(name: str | None) -> str:
    from fedrift.report.published import PUBLISHED

    table = PUBLISHED.get(name or "")
    if table is None:
        return ""
    short = table.paper.split(" (", 1)[0]
    authors = table.paper.split(" (", 1)[1].split(",", 1)[0] if " (" in table.paper else ""
    return f"{short} ({authors}), {table.table}, {table.dataset} (`report.paper={table.name}`)"


def entry(path: Path, benchmarks: str, studies: dict[Path, dict[str, Any]]) -> dict[str, str]:
    """One file's row: what it runs, what it reproduces, what it costs."""
    from fedrift.report.published import PUBLISHED

    lines = header(path)
    doc = _load(path)
    cmds = commands(lines)
    is_study = path.name.endswith(".study.yaml")
    if is_study:
        base = doc.get("base")
        config = _load(path.parent / base) if isinstance(base, str) else dict(base or {})
        for key, value in (doc.get("overrides") or {}).items():
            _set(config, key, value)
        algorithms = _entry_names(doc.get("entries"))
        paper = _paper((doc.get("report") or {}).get("paper"))
    else:
        config = doc
        algorithms = list(dict.fromkeys([(config.get("algorithm") or {}).get("name", "fedavg"),
                                         *_header_algorithms(cmds)]))
        named = [s for s, study in studies.items() if study.get("base") == path.name and s.parent == path.parent]
        table = next((t for t in PUBLISHED if path.stem.startswith(t)), None)
        paper = _paper((studies[named[0]].get("report") or {}).get("paper")) if named else _paper(table)
    if not paper:
        design = re.search(r"\(([^()]*(?:Table|design)[^()]*)\)", description(lines))
        paper = f"design only: {design.group(1)}" if design else ""
    train = config.get("train") or {}
    cost, work = _cost(train)
    if is_study:
        sweep = doc.get("sweep") or {}
        settings = [dict(zip(sweep, values)) for values in itertools.product(*sweep.values())] or [{}]
        seeds = len(doc.get("seeds") or [config.get("seed", 0)])
        per_setting = []
        for setting in settings:
            t = dict(train)
            t.update({k.split(".", 1)[1]: v for k, v in setting.items() if k.startswith("train.")})
            per_setting.append(_cost(t))
        entries = len(doc.get("entries") or [])  # not len(algorithms): fedadc:variant=... twice is one name
        runs = entries * seeds * len(settings)
        total = sum(w for _, w in per_setting) * entries * seeds
        costs = ", ".join(dict.fromkeys(c for c, _ in per_setting))
        cost = (f"{runs} runs ({entries} entries x {seeds} seeds x {len(settings)} settings) of {costs}: "
                f"{total:,} client-epochs" + (", and the tune" if doc.get("tune") else ""))
    else:
        cost = f"{cost} = {work:,} client-epochs" if work else cost
    partition = config.get("partition") or {}
    data = config.get("data") or {}
    return {
        "file": path.relative_to(ROOT).as_posix(),
        "kind": "study" if is_study else "config",
        "dataset": _options(data, ("size",)) if data else "",
        "partition": _options(partition, ("alpha", "classes_per_client", "clients_per_domain", "num_clients"))
        + (f", swept: {', '.join(f'{k} {v}' for k, v in (doc.get('sweep') or {}).items())}" if is_study and doc.get("sweep") else ""),
        "model": _options(config.get("model") or {}, ()),
        "algorithms": ", ".join(f"`{a}`" for a in algorithms),
        "paper": paper,
        "cost": cost,
        "time": measured(path, lines, benchmarks),
        "description": description(lines),
        "commands": "\n".join(cmds),
    }


def _cell(value: str) -> str:
    return " ".join(value.split()).replace("|", "\\|") or "-"


def _anchor(file: str) -> str:
    return "example-" + re.sub(r"[^a-z0-9]+", "-", file.removeprefix("examples/").removesuffix(".yaml").lower()).strip("-")


def examples_page(folder: Path = EXAMPLES, benchmarks_path: Path = BENCHMARKS) -> str:
    """The examples page's Markdown: a summary table, then a section a file."""
    benchmarks = benchmarks_path.read_text() if benchmarks_path.is_file() else ""
    files = example_files(folder)
    studies = {p: _load(p) for p in files if p.name.endswith(".study.yaml")}
    rows = [entry(p, benchmarks, studies) for p in files]
    lines = [(f"{len(rows)} files: {sum(r['kind'] == 'config' for r in rows)} configs and "
              f"{sum(r['kind'] == 'study' for r in rows)} paper studies. Cost: rounds x clients a round x local "
              "epochs of one run (client-epochs: their product); a study runs every entry on every seed and "
              "swept setting."), "",
             "| file | dataset | partition | model | algorithms | reproduces | cost |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| [`{r['file']}`](#{_anchor(r['file'])}) | {_cell(r['dataset'])} | {_cell(r['partition'])} | "
                     f"{_cell(r['model'])} | {_cell(r['algorithms'])} | {_cell(r['paper'])} | {_cell(r['cost'])} |")
    lines.append("")
    for r in rows:
        lines.extend([f"({_anchor(r['file'])})=", f"## `{r['file']}`", "", r["description"] or "(no header comment)", "",
                      (f"- **{'study' if r['kind'] == 'study' else 'config'}**: dataset {_cell(r['dataset'])}, "
                       f"partition {_cell(r['partition'])}, model {_cell(r['model'])}"),
                      f"- **algorithms**: {_cell(r['algorithms'])}",
                      f"- **reproduces**: {_cell(r['paper']) if r['paper'] else 'no paper (an example of its own)'}",
                      f"- **cost**: {_cell(r['cost'])}",
                      f"- **measured**: {_cell(r['time']) if r['time'] else 'no measured time in its header or BENCHMARKS.md'}",
                      ""])
        if r["commands"]:
            lines.extend(["```text", r["commands"], "```", ""])
    return "\n".join(lines)


def write(folder: Path = GENERATED) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "examples.md"
    page = examples_page()
    if not path.is_file() or path.read_text() != page:  # unchanged: its time kept, no rebuild
        path.write_text(page)
    return path


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", lambda app: write())
    return {"parallel_read_safe": True, "version": "1"}


if __name__ == "__main__":
    print(write())
