"""The reference pages generated from the code, so they cannot drift from it.

Each ``*_page`` function takes the object it documents (the argparse parser, the pydantic
config model, a registry) and returns Markdown; :func:`write_all` writes them into
``docs/_generated/``, where the reference pages include them. As a Sphinx extension this
module runs :func:`write_all` when the build starts, and fails the build (a warning under
``-W``) for a config key without a description.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterable

GENERATED = Path(__file__).resolve().parents[1] / "_generated"
# Each algorithm module's generated part (options, tuning space) is _generated/algorithms/<module>.md,
# included by the prose pages of docs/reference/algorithms/ (the problem, the maths, the paper).
ALGORITHM_PARTS = "algorithms"
ALGORITHM_PAGES = Path(__file__).resolve().parents[1] / "reference" / "algorithms"

# The peer-agreement suite's results (tests/peers/, issue 69): written by the suite, read here.
AGREEMENT = Path(__file__).resolve().parents[1] / "reference" / "agreement.json"

# Section titles of the config page, in the order a config file usually reads.
SECTIONS = ("data", "partition", "model", "algorithm", "train", "engine", "eval", "privacy", "output")
NAMED = {"data": "datasets", "partition": "partitions", "model": "models", "algorithm": "algorithms"}


# ---------------------------------------------------------------------------------------
# Small formatting helpers


def built_in(registry: Any) -> list[Any]:
    """The registry's own entries: a plugin loaded in this process (an installed package's entry
    point, a test's) is the user's, not fedrift's reference."""
    return [entry for entry in registry if entry.source == "built in"]


def text(value: Any) -> str:
    """Prose from the code (help, descriptions, registry lines) as Markdown shows it as
    written: ``*``, ``_``, ``<``, ``>``, ``[`` and ``]`` escaped outside its `code` spans."""
    parts = str(value).split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = re.sub(r"([\\*_<>\[\]])", r"\\\1", parts[i])
    return "`".join(parts) if len(parts) % 2 else str(value).replace("`", "\\`")


def cell(value: Any) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")


def code(value: Any) -> str:
    """A value as inline code, as a YAML file or the command line would write it."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(code(v).strip("`") for v in value) + "]"
    else:
        text = str(value)
    return f"`{text}`" if "`" not in text else f"``{text}``"


def type_name(annotation: Any) -> str:
    """``int``, ``float | null``, ``list[int]``, ``str``: the type a key takes, as a reader writes it."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(type_name(a) for a in args))
    if origin is typing.Literal:
        return "choice"
    if origin in (list, tuple):
        return f"list[{type_name(args[0])}]" if args else "list"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def allowed(annotation: Any, metadata: Iterable[Any] = ()) -> str:
    """What values a key takes: the literals, the bounds of its constraints, null."""
    parts: list[str] = []

    def walk(ann: Any, meta: Iterable[Any]) -> None:
        origin = typing.get_origin(ann)
        args = typing.get_args(ann)
        for m in meta:
            for attr, sym in _BOUNDS.items():
                v = getattr(m, attr, None)
                if v is not None:
                    parts.append(f"{sym} {v}")
        if origin is typing.Annotated:
            walk(args[0], args[1:])
        elif origin in (typing.Union, types.UnionType):
            for a in args:
                walk(a, ())
        elif origin is typing.Literal:
            parts.extend(code(a) for a in args)
        elif ann is type(None):
            parts.append("`null`")

    walk(annotation, metadata)
    return ", ".join(dict.fromkeys(parts))


# ---------------------------------------------------------------------------------------
# The CLI, from fedrift's argparse parser


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, sub, helps.get(name) or ""))
    return out


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(a.option_strings) if a.option_strings else (a.metavar or a.dest)
        if a.option_strings and a.nargs != 0:
            name += f" {a.metavar or a.dest.upper()}"
        default = "" if a.default in (None, False, argparse.SUPPRESS) or not a.option_strings else code(a.default)
        choices = ", ".join(code(c) for c in a.choices) if a.choices else ""
        rows.append(f"| `{cell(name)}` | {default} | {choices} | {cell(text(a.help or ''))} |")
    return rows


def cli_page(parser: argparse.ArgumentParser) -> str:
    """Every command and subcommand of ``parser``: usage, description and arguments."""
    lines = [f"`{parser.prog}`: {text(parser.description or '')}", ""]

    def command(prefix: str, sub: argparse.ArgumentParser, help_: str, depth: int) -> None:
        lines.extend([f"{'#' * depth} `{prefix}`", ""])
        if help_:
            lines.extend([text(help_[0].upper() + help_[1:]) + ".", ""])
        if sub.description:
            lines.extend([text(sub.description), ""])
        lines.extend(["```text", sub.format_usage().strip().removeprefix("usage: "), "```", ""])
        rows = _argument_rows(sub)
        if rows:
            lines.extend(["| argument | default | choices | meaning |", "|---|---|---|---|", *rows, ""])
        for name, child, child_help in _subparsers(sub):
            command(f"{prefix} {name}", child, child_help, depth + 1)

    for name, sub, help_ in _subparsers(parser):
        command(f"{parser.prog} {name}", sub, help_, 2)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The config keys, from the pydantic models


def config_fields(model: type) -> list[tuple[str, Any]]:
    """(key, FieldInfo) of every field of ``model`` and of its section models, dotted."""
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out.extend((f"{name}.{k}", v) for k, v in config_fields(ann))
        else:
            out.append((name, info))
    return out


def missing_descriptions(model: type) -> list[str]:
    """Config keys without a ``description=``: the build refuses them."""
    return [key for key, info in config_fields(model) if not info.description]


def config_page(model: type, names: dict[str, list[str]] | None = None) -> str:
    """One table per section: key, type, default, allowed values, description. ``names``:
    each named section's registered entries, listed as the allowed values of its ``name``."""
    names = names or {}
    fields = config_fields(model)
    top = [(k, v) for k, v in fields if "." not in k]
    groups: dict[str, list[tuple[str, Any]]] = {"": top}
    for key, info in fields:
        if "." in key:
            groups.setdefault(key.split(".", 1)[0], []).append((key, info))
    lines: list[str] = []
    for section, items in groups.items():
        title = f"`{section}`" if section else "Top level"
        lines.extend([f"## {title}", ""])
        if section:
            about = model.model_fields[section].description
            lines.extend([text(about[0].upper() + about[1:]) + ".", ""])
        if section in NAMED:
            lines.extend([f"Besides these keys the section takes the chosen entry's own options: see "
                          f"[{NAMED[section]}]({NAMED[section]}.md).", ""])
        lines.extend(["| key | type | default | allowed | description |", "|---|---|---|---|---|"])
        for key, info in items:
            default = info.get_default(call_default_factory=True)
            if hasattr(default, "model_dump"):
                continue  # a section: its keys follow
            allow = allowed(info.annotation, info.metadata)
            if key.endswith(".name") and key.split(".")[0] in names:
                allow = ", ".join(code(n) for n in names[key.split(".")[0]])
            lines.append(f"| `{key}` | {cell(type_name(info.annotation))} | {code(default)} | {cell(allow)} | "
                         f"{cell(text(info.description or ''))} |")
        lines.append("")
    return "\n".join(lines)


def options_page(model: type, prefix: str) -> str:
    """A flat options model's table (``ReportOptions``: the ``report.*`` options of ``fedrift
    compare``, ``fedrift report`` and a study's ``report:``), each key under ``prefix``."""
    lines = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        lines.append(f"| `{prefix}.{name}` | {cell(type_name(info.annotation))} | {code(info.get_default())} | "
                     f"{cell(allowed(info.annotation, info.metadata))} | {cell(text(info.description or ''))} |")
    return "\n".join(lines) + "\n"


def missing_option_descriptions(model: type, prefix: str) -> list[str]:
    """Options of a flat options model without a ``description=``: the build refuses them."""
    return [f"{prefix}.{name}" for name, info in model.model_fields.items() if not info.description]


# ---------------------------------------------------------------------------------------
# Registry entries: algorithms, datasets, partitions, models


def options_table(params: type | None, meanings: dict[str, str] | None = None) -> list[str]:
    """An entry's options (a pydantic dataclass): name, type, default, allowed values, and with
    ``meanings`` (:func:`option_meanings`) what each one does."""
    fields = getattr(params, "__pydantic_fields__", None) if params is not None else None
    if not fields:
        return ["No options.", ""]
    head = ["option", "type", "default", "allowed"] + (["meaning"] if meanings is not None else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, info in fields.items():
        default = info.get_default(call_default_factory=True)
        row = [f"`{name}`", cell(type_name(info.annotation)), code(default),
               cell(allowed(info.annotation, info.metadata))]
        if meanings is not None:
            row.append(cell(text(meanings.get(name, ""))))
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def rest_to_markdown(value: str) -> str:
    """A docstring's reStructuredText inline markup as Markdown: a double-backquoted literal and a
    role (``:func:`name```) become single-backquoted code."""
    value = re.sub(r":[\w:]+:`~?([^`]+)`", r"``\1``", value)
    return re.sub(r"``(.+?)``", lambda m: f"`{m.group(1)}`", value)


def option_meanings(params: type | None) -> dict[str, str]:
    """Each option's meaning from the options class's docstring and its bases' (a subclass's
    wins): the paragraph that opens with ``name:`` for a field ``name``, on one line, its
    reStructuredText markup as Markdown. Other lines of the docstring (its heading) are left out."""
    fields = getattr(params, "__pydantic_fields__", None) if params is not None else None
    if not fields:
        return {}
    found: dict[str, list[str]] = {}
    for cls in reversed(params.__mro__):
        doc = cls.__dict__.get("__doc__") or ""
        if not doc or doc.startswith(cls.__name__ + "("):  # none, or the generated dataclass one
            continue
        current = None
        for line in inspect.cleandoc(doc).splitlines():
            entry = re.match(r"(\w+): (.*)", line)
            if entry and entry.group(1) in fields:
                current = entry.group(1)
                found[current] = [entry.group(2)]
            elif not line.strip():
                current = None
            elif current is not None:
                found[current].append(line.strip())
    return {name: rest_to_markdown(" ".join(parts)) for name, parts in found.items()}


def _own_doc(params: type | None) -> str:
    """The options class's own docstring (not one it inherits, nor the generated dataclass one)."""
    if params is None:
        return ""
    doc = params.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(params.__name__ + "("):
        return ""
    return inspect.cleandoc(doc)


def fence(text: str) -> list[str]:
    """A docstring shown as written (its math uses ``*``, ``_`` and ``|`` freely)."""
    return ["```text", text, "```", ""]


def registry_page(registry: Any, kind: str) -> str:
    """Every entry of ``registry``: its line, its options, and where it is defined."""
    names = [entry.name for entry in built_in(registry)]
    lines = [f"{len(names)} {kind}s: " + ", ".join(f"[`{n}`](#{kind}-{n.replace('_', '-')})" for n in names) + ".", ""]
    for entry in built_in(registry):
        module = entry.factory.__module__
        lines.extend([f"({kind}-{entry.name.replace('_', '-')})=", f"## `{entry.name}`", "", cell(text(entry.doc)), "",
                      f"Defined in `{module}` ({entry.source}).", ""])
        own = _own_doc(entry.params)
        if own:
            lines.extend(fence(own))
        lines.extend(options_table(entry.params))
    return "\n".join(lines)


def algorithm_family(module: str) -> str:
    """The file name of an algorithm module's generated part: its last dotted name."""
    return module.rsplit(".", 1)[-1]


def algorithms_page(registry: Any, default_space: Any) -> dict[str, str]:
    """The generated part of the algorithms reference, one Markdown text per module that defines
    algorithms (by :func:`algorithm_family`): for each of its algorithms an anchor
    (``algorithm-<name>``), a heading, its line, its options with their defaults and meanings
    (the options class's docstring) and ``fedrift tune``'s default search space. The prose
    around them (the problem, the method's maths, the paper, where fedrift departs) is
    written in ``docs/reference/algorithms/*.md``, which include these."""
    by_module: dict[str, list[Any]] = {}
    for entry in built_in(registry):
        by_module.setdefault(entry.factory.__module__, []).append(entry)
    out = {}
    for module, entries in by_module.items():
        lines: list[str] = []
        for entry in entries:
            lines.extend([f"(algorithm-{entry.name.replace('_', '-')})=", f"### `{entry.name}`", "",
                          cell(text(entry.doc)) + ".", "", f"Defined in `{module}`.", ""])
            lines.extend(options_table(entry.params, option_meanings(entry.params)))
            space = default_space(entry.name)
            lines.extend(["Tuning space (`fedrift tune`): " + ", ".join(f"`{k}` `{v}`" for k, v in space.items())
                          + ".", ""])
            lines.extend(agreement_line(entry.name, agreement_rows()))
        out[algorithm_family(module)] = "\n".join(lines)
    return out


def summary_table(registry: Any, kind: str) -> str:
    """One row per entry: its name (a link to its section), its line, its options with defaults."""
    lines = [f"| {kind} | what | options (defaults) |", "|---|---|---|"]
    for entry in built_in(registry):
        fields = getattr(entry.params, "__pydantic_fields__", None) or {}
        options = ", ".join(f"`{name}` {code(info.get_default(call_default_factory=True)).strip('`')}"
                            for name, info in fields.items() if name != "aggregation")
        lines.append(f"| [`{entry.name}`](#{kind}-{entry.name.replace('_', '-')}) | {cell(text(entry.doc))} | {cell(options)} |")
    return "\n".join([*lines, ""])


# ---------------------------------------------------------------------------------------
# Agreement with other implementations (tests/peers/ writes AGREEMENT)


def agreement_rows(path: Path = AGREEMENT) -> list[dict[str, Any]]:
    """The suite's rows (algorithm, peer, version, rounds, compared, difference, verdict, reason)."""
    return json.loads(path.read_text())["pairs"] if path.is_file() else []


def agreement_anchor(subject: str) -> str:
    return "agreement-" + re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")


def agreement_line(algorithm: str, rows: list[dict[str, Any]]) -> list[str]:
    """The algorithm's line under its options: which peers it was checked against, and how it came out."""
    mine = [r for r in rows if r["algorithm"] == algorithm]
    if not mine:
        return []
    verdicts = "; ".join(f"{r['version']}: {r['verdict']}" for r in mine)
    return [f"Checked against other implementations ({{ref}}`the agreement page <{agreement_anchor(algorithm)}>`): "
            f"{verdicts}.", ""]


def agreement_page(rows: list[dict[str, Any]], rule: str) -> str:
    """The reference page's generated part: an overview (subject x peer), then a section per
    subject (an algorithm, a partition) with each peer's row and, where it departs, why."""
    peers = list(dict.fromkeys(r["peer"] for r in sorted(rows, key=lambda r: r["peer"])))
    subjects = list(dict.fromkeys(r["algorithm"] for r in rows))
    by = {(r["algorithm"], r["peer"]): r for r in rows}
    lines = [f"{len(rows)} pairs over {len(peers)} peers; the rule: {cell(rule)}.", "",
             "| compared | " + " | ".join(peers) + " |", "|---|" + "---|" * len(peers)]
    for subject in subjects:
        marks = [by[(subject, p)]["verdict"] if (subject, p) in by else "" for p in peers]
        lines.append(f"| [{cell(subject)}](#{agreement_anchor(subject)}) | " + " | ".join(marks) + " |")
    lines.append("")
    for subject in subjects:
        lines.extend([f"({agreement_anchor(subject)})=", f"### {subject}", "",
                      "| peer | compared | rounds | largest relative difference | verdict |", "|---|---|---|---|---|"])
        mine = [by[(subject, p)] for p in peers if (subject, p) in by]
        for r in mine:
            rounds = ", ".join(map(str, r["rounds"])) or "-"
            lines.append(f"| {cell(r['version'])} | {cell(r['compared'])} | {rounds} | {r['difference']:.2g} | {r['verdict']} |")
        lines.append("")
        for r in mine:
            if r["reason"]:
                lines.extend([f"*{cell(r['version'])} departs*: {text(r['reason'])}", ""])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Writing the pages


def pages() -> dict[str, str]:
    """Every generated page's file name and text, from the installed fedrift."""
    from fedrift.algorithms import ALGORITHMS
    from fedrift.cli import _parser
    from fedrift.config import Config
    from fedrift.data import DATASETS
    from fedrift.data.partition import PARTITIONS
    from fedrift.experiments.space import default_space
    from fedrift.models import MODELS
    from fedrift.report.html import ReportOptions

    names = {section: [e.name for e in built_in(registry)] for section, registry in
             (("data", DATASETS), ("partition", PARTITIONS), ("model", MODELS), ("algorithm", ALGORITHMS))}
    return {
        "cli.md": cli_page(_parser()),
        "config.md": config_page(Config, names),
        "report-options.md": options_page(ReportOptions, "report"),
        "algorithms-table.md": summary_table(ALGORITHMS, "algorithm"),
        "datasets.md": registry_page(DATASETS, "dataset"),
        "partitions.md": registry_page(PARTITIONS, "partition"),
        "models.md": registry_page(MODELS, "model"),
        "agreement.md": agreement_page(agreement_rows(), _agreement_rule()),
        **{f"{ALGORITHM_PARTS}/{family}.md": part
           for family, part in algorithms_page(ALGORITHMS, default_space).items()},
    }


def _agreement_rule(path: Path = AGREEMENT) -> str:
    return json.loads(path.read_text())["rule"] if path.is_file() else "no results written yet"


def families_without_a_page(pages_dir: Path = ALGORITHM_PAGES) -> list[str]:
    """The algorithm modules whose generated part (``_generated/algorithms/<family>.md``) no page
    of ``docs/reference/algorithms/`` includes: their algorithms would be on no page."""
    from fedrift.algorithms import ALGORITHMS

    prose = "\n".join(p.read_text() for p in sorted(pages_dir.glob("*.md")))
    families = dict.fromkeys(algorithm_family(e.factory.__module__) for e in built_in(ALGORITHMS))
    return [f for f in families if f"_generated/{ALGORITHM_PARTS}/{f}.md" not in prose]


def write_all(folder: Path = GENERATED) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, page in pages().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != page:  # unchanged files keep their time: no rebuild
            path.write_text(page)
        written.append(path)
    return written


def _on_builder_inited(app: Any) -> None:
    from sphinx.util import logging

    from fedrift.config import Config

    log = logging.getLogger(__name__)
    for key in missing_descriptions(Config):
        log.warning(f"config key {key} has no description= in src/fedrift/config.py; the config reference needs one")
    from fedrift.report.html import ReportOptions

    for key in missing_option_descriptions(ReportOptions, "report"):
        log.warning(f"report option {key} has no description= in src/fedrift/report/html.py (ReportOptions); the "
                    "config reference needs one")
    write_all()
    for family in families_without_a_page():
        log.warning(f"the algorithms of fedrift.algorithms.{family} are on no page: include "
                    f"_generated/{ALGORITHM_PARTS}/{family}.md in a page of docs/reference/algorithms/ (the "
                    "problem, the method's maths, the paper, where fedrift departs) and list it in its toctree")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "version": "1"}


if __name__ == "__main__":
    for p in write_all():
        print(p)
