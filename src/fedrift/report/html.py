"""The comparison report: tables (terminal, CSV, Markdown), figures, and one ``report.html``.

``report.html`` is self-contained: styles inline, figures embedded as base64 PNG
(``data:`` URLs), no script, no external URL, so it opens offline and can be mailed as one
file. It holds the grid, the results table (``<table id="results">``), the figures, and the
resolved config of one run per setting in collapsible ``<details>``.

Options (``report.*`` on the command line, keyword arguments in Python):

- ``at_rounds``: accuracy at these rounds (default: the runs' ``eval.at_rounds`` if any set,
  else 10, 20, 50; rounds past every run's end are dropped);
- ``target``: rounds-to-target rule: an accuracy (``0.9``), ``ALG:FRACTION`` (``fedavg:0.9``),
  or ``none``; default ``fedavg:0.9`` when fedavg is in the grid (BENCH.md), else none;
- ``tsne``: algorithms whose final global model's features get a t-SNE panel (default: the
  reference method, or the grid's first without one, beside the other setting with the
  highest mean accuracy at the first swept values, the caption says which and why;
  ``none`` for no t-SNE); ``tsne_points`` (1000) test samples;
- ``band``: ``minmax`` (default) or ``std``, the learning curves' band over seeds;
- ``reference``: the algorithm the paired differences are taken to (:mod:`fedrift.report.paired`;
  a label of the grid, or a name only one of its settings has); default ``fedavg`` when the
  grid has it, ``none`` for no paired differences;
- ``metric``: ``accuracy``, ``local_accuracy`` or ``local_accuracy_worst10``: a ``rank`` column on
  it (:func:`fedrift.report.table.add_ranks`), the claims judged on it
  (:mod:`fedrift.report.claims`), and ``fedrift select``'s recommendation made on it; default none
  (no rank column, claims on the accuracy);
- ``claims``: orderings to check with the paired differences, ``A>B`` or ``A>=B`` (``papers``:
  the seed papers' orderings among the grid's algorithms; :mod:`fedrift.report.claims`),
  printed after the table and written to ``claims.csv``, ``claims.md`` and the report;
- ``paper``: a published table (``fedgkd-table3-cifar10``, ...: :mod:`fedrift.report.published`)
  whose numbers go beside the measured ones: the paper's setting a run matches, the published
  accuracy and the published gap to FedAvg, with a note naming paper, table and source file;
- ``plots``: false writes the tables and a report without figures;
- ``title``: the report's title (default: the algorithms, data and partition compared).

Run folders may come from anyone: a folder whose ``config.yaml`` cannot be read is skipped,
and a ``final_model.pt`` that is not a state dict of tensors leaves out its figure, each with
a line saying why (printed, and at the top of the page); the plugins a run's config names are
imported only with ``trust_plugins`` (``fedrift report --trust-plugins``), else the runs are
reported from their files.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import pickle
import re
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedrift.errors import ConfigError, FedriftError, writing
from fedrift.overrides import parse_value, split_list
from fedrift.plugins import run_folders
from fedrift.report import claims, published
from fedrift.report.paired import resolve_reference
from fedrift.report.table import (
    Group,
    check_metric,
    default_target,
    describe_groups,
    display_table,
    load_groups,
    metric_key,
    notes as table_notes,
    parse_target,
    print_table,
    summarize,
    to_csv,
    to_markdown,
)
from fedrift.safe_files import make_dir, write_atomic

Echo = Callable[[str], None]


PositiveInt = Annotated[int, Field(ge=1)]


class ReportOptions(BaseModel):
    """The ``report.*`` options (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at_rounds: list[PositiveInt] | None = Field(None, description=(
        "accuracy at these rounds, a column each (null: the runs' `eval.at_rounds` if any set, else 10, 20, 50; "
        "rounds past every run's end are dropped)"))
    target: float | str | None = Field("auto", description=(
        "rounds to target: an accuracy (`0.9`), `ALG:FRACTION` (`fedavg:0.9`: that share of the algorithm's best) or "
        "`none`; `auto`: `fedavg:0.9` when FedAvg is in the grid"))
    tsne: list[str] | None = Field(None, description=(
        "algorithms whose final global model's features get a t-SNE panel (null: the reference beside the best other "
        "setting; `none`: no t-SNE)"))
    tsne_points: Annotated[int, Field(ge=10)] = Field(1000, description="test samples in each t-SNE panel")
    band: Literal["minmax", "std"] = Field("minmax", description=(
        "the learning curves' band over seeds: min to max, or mean +- std"))
    reference: str | None = Field("auto", description=(
        "the algorithm paired differences are taken to (a label of the grid, or a name one setting has); `auto`: "
        "`fedavg` when the grid has it; `none`: no paired differences"))
    metric: Literal["accuracy", "local_accuracy", "local_accuracy_worst10"] | None = Field(None, description=(
        "what the report ranks on (a `rank` column), its claims judge and `fedrift select` recommends on: `accuracy` "
        "(the test accuracy at best validation, else the best accuracy), `local_accuracy` (the mean over clients of "
        "their accuracy on their own test splits) or `local_accuracy_worst10` (the mean of the worst 10% of those "
        "clients); null: no rank column, claims on `accuracy`"))
    claims: list[str] | None = Field(None, description=(
        "orderings to check with the paired differences, `A>B` or `A>=B`, or `papers` (the papers' orderings among "
        "the grid's algorithms)"))
    paper: str | None = Field(None, description=(
        "a published table (`fedgkd-table3-cifar10`, ...) whose numbers go beside the measured ones"))
    plots: bool = Field(True, description="false: the tables and a report without figures")
    title: str | None = Field(None, description="the report's title (null: the algorithms, data and partition compared)")

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | "ReportOptions" | None) -> "ReportOptions":
        """From ``report.*`` values: CLI strings (``"10,20,50"``, ``"fedavg:0.9"``) or Python values."""
        if isinstance(raw, ReportOptions):
            return raw

        doc: dict[str, Any] = {}
        for key, value in (raw or {}).items():
            if key == "metric":
                doc[key] = check_metric(value)  # refused in one line naming the allowed metrics
                continue
            if isinstance(value, str) and key in ("at_rounds", "tsne", "claims"):
                items = split_list(value)
                if key == "tsne" and [i.lower() for i in items] in ([], ["none"], ["off"]):
                    value = []
                else:
                    value = [parse_value(i) if key == "at_rounds" else i for i in items]
            elif isinstance(value, str) and key not in ("title", "target", "reference", "paper"):
                value = parse_value(value)
            elif isinstance(value, str) and key == "target":
                parsed = parse_value(value)
                value = parsed if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) else value
            doc[key] = value
        try:
            opts = cls.model_validate(doc)
        except ValidationError as err:
            first = err.errors()[0]
            key = "report." + ".".join(str(p) for p in first["loc"][:1])
            if first["type"] == "extra_forbidden":
                raise ConfigError(f"{key}: unknown key; allowed: {', '.join(sorted(cls.model_fields))}") from None
            got = first.get("input")
            raise ConfigError(f"{key}: {first['msg'].lower()} (got {got!r})") from None
        if opts.target != "auto":
            parse_target(opts.target)  # refuses a bad rule now
        published.get(opts.paper)  # and an unknown paper table
        return opts

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k in self.model_fields_set}


# ---------------------------------------------------------------------------------------
# Building the report


def resolve_at_rounds(opts: ReportOptions, groups: Sequence[Group]) -> list[int]:
    runs = [r for g in groups for r in g.runs]
    last = max((int(r.metrics[-1].get("round", 0)) for r in runs if r.metrics), default=0)
    if opts.at_rounds is not None:
        wanted = list(dict.fromkeys(opts.at_rounds))
    else:
        wanted = sorted({int(t) for r in runs for t in ((r.config.get("eval") or {}).get("at_rounds") or [])}) or [10, 20, 50]
    return [t for t in wanted if t <= last] if last else []


def _target(opts: ReportOptions, groups: Sequence[Group]) -> Any:
    return default_target(groups) if opts.target == "auto" else opts.target


def write_tables(root: Path, raw: Mapping[str, Any] | ReportOptions | None = None, echo: Echo = print,
                 quiet_table: bool = False, trust_plugins: bool = False) -> list[dict[str, Any]]:
    """``results.csv`` and ``results.md`` under ``root``; prints the table; returns the rows
    (``trust_plugins``: as :func:`build_report`'s)."""
    notes: list[str] = []
    with run_folders(trust_plugins) as untrusted:
        groups, grid = load_groups(Path(root), notes)
        for line in notes + _plugins_note(groups, untrusted):
            echo(line)
        opts = _merged_options(grid, raw)
        rows, _, _ = _tables(Path(root), groups, opts, echo, quiet_table)
    return rows


def _plugins_note(groups: Sequence[Group], names: Sequence[str]) -> list[str]:
    """The line saying which plugins named by the runs' config.yaml were not imported, and how
    to import them ([] when none was left out)."""
    if not names:
        return []
    named = [r.dir for g in groups for r in g.runs if r.config.get("plugins")]
    where = ""
    if named:
        where = f" (named by the config.yaml of {len(named)} run folder{'s' if len(named) != 1 else ''}, e.g. {named[0]})"
    return [(f"plugins not imported: {', '.join(names)}{where}: a report runs no code from run folders; the runs are "
             "reported from their files (what needs a plugin, such as a t-SNE of its model, is left out); "
             "--trust-plugins (trust_plugins=True in Python) imports them, running their code: only for run folders "
             "you trust")]


def _merged_options(grid: dict[str, Any] | None, raw: Mapping[str, Any] | ReportOptions | None) -> ReportOptions:
    if isinstance(raw, ReportOptions):
        return raw
    stored = dict((grid or {}).get("report") or {})
    return ReportOptions.parse({**stored, **dict(raw or {})})


def _tables(root: Path, groups: list[Group], opts: ReportOptions, echo: Echo, quiet: bool = False):
    at_rounds = resolve_at_rounds(opts, groups)
    reference = resolve_reference(opts.reference, [g.algorithm for g in groups])
    rows = summarize(groups, at_rounds, _target(opts, groups), reference, opts.metric)
    key = metric_key(opts.metric, (r.summary for g in groups for r in g.runs))
    if key is not None and not quiet and not any(r.get("rank") is not None for r in rows):
        echo(f"report.metric={opts.metric}: no completed run reports {key} in its summary.json (runs from before it, "
             "or without the clients' own test splits): nothing is ranked")
    published.add_published(groups, rows, opts.paper)
    checked = _claims(root, groups, opts)
    with _writing(root):
        write_atomic(root / "results.csv", to_csv(rows))
        write_atomic(root / "results.md", to_markdown(rows, at_rounds))
    if not quiet and echo is print:
        print_table(rows, at_rounds, title=report_title(root, groups, opts))
    elif not quiet:
        echo(to_markdown(rows, at_rounds))
    if checked and not quiet:
        echo(claims.to_text(checked))
    return rows, at_rounds, checked


def report_title(root: Path, groups: Sequence[Group], opts: ReportOptions) -> str:
    """``report.title``, else what was compared (``fedrift comparison: fedavg, fedprox on mnist
    (dirichlet alpha=0.1, 20 clients)``), else the folder's name."""
    return opts.title or f"fedrift comparison: {describe_groups(groups) or root.resolve().name}"


def _claims(root: Path, groups: Sequence[Group], opts: ReportOptions) -> list[dict[str, Any]]:
    """``report.claims`` checked on the groups, written to claims.csv and claims.md (the
    files of an earlier report without claims are removed: they would describe other runs)."""
    found = claims.resolve_claims(opts.claims, [g.algorithm for g in groups])
    checked = claims.check_claims(found, groups, opts.metric)
    with _writing(root):
        for name, write in (("claims.csv", claims.to_csv), ("claims.md", claims.to_markdown)):
            if checked:
                write_atomic(root / name, write(checked))
            elif (root / name).is_file() or (root / name).is_symlink():
                (root / name).unlink()
    return checked


def make_figures(root: Path, groups: list[Group], opts: ReportOptions, echo: Echo = print,
                 rows: Sequence[Mapping[str, Any]] = ()) -> list[Any]:
    """The figures; ``rows`` (the table's) choose the t-SNE's default panels."""
    from fedrift.report.plots import client_accuracy, drift_curves, learning_curves, partition_plots, worst10_curves
    from fedrift.report.tsne import choose_runs, default_algorithms, tsne_plot

    folder = make_dir(root / "figures")
    for pattern in ("learning_curves.*", "worst10_curves.*", "client_accuracy.*", "drift.*", "partition-*.*",
                    "tsne.*"):  # this report's own files
        for old in folder.glob(pattern):
            if old.suffix in (".png", ".svg"):
                old.unlink()
    plots = []
    lc = learning_curves(groups, folder / "learning_curves", opts.band)
    if lc:
        plots.append(lc)
    for figure in (worst10_curves(groups, folder / "worst10_curves", opts.band),
                   client_accuracy(groups, folder / "client_accuracy")):
        if figure:
            plots.append(figure)
    dc = drift_curves(groups, folder / "drift", opts.band)
    if dc:
        plots.append(dc)
    plots += partition_plots(groups, folder, warn=echo)
    names, why = (opts.tsne, "") if opts.tsne is not None else default_algorithms(groups, rows)
    chosen = choose_runs(groups, names)
    if chosen:
        try:
            unread = [problem for problem in (_model_problem(run) for _, run in chosen) if problem]
            for line in unread:
                echo(f"t-SNE skipped: {line}")
            ts = None if unread else tsne_plot(chosen, folder / "tsne", opts.tsne_points, why=why)
        except FedriftError as err:
            echo(f"t-SNE skipped: {err}")
            ts = None
        except (OSError, RuntimeError, KeyError) as err:
            echo(f"t-SNE skipped: {_torch_reason(err)}")
            ts = None
        if ts:
            plots.append(ts)
    elif opts.tsne != []:
        echo("t-SNE skipped: no completed run with final_model.pt among the chosen algorithms")
    return plots


def _model_problem(run: Any) -> str:
    """Why the run's ``final_model.pt`` cannot go into a figure, on one line naming the file
    ("" when it can): a file ``torch.load(weights_only=True)`` refuses (it holds Python objects
    besides tensors: never unpickled here), a truncated or damaged file, one that is not a
    state dict of tensors, or one whose tensors do not fit the model the run's config builds."""
    import torch

    from fedrift.report.tsne import run_features

    path = Path(run.dir) / "final_model.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # torch's message advises weights_only=False: not repeated
        found = re.search(r"GLOBAL (\S+) was not an allowed global", str(err))
        what = f"a Python object ({found.group(1)})" if found else "pickled data other than tensors"
        return f"{path}: holds {what}; a model file is read as tensors only, nothing else in it is loaded"
    except EOFError:
        return f"{path}: truncated (the file ends early)"
    except Exception as err:  # noqa: BLE001 - bytes from anywhere: a cut zip archive, another format
        return f"{path}: damaged or truncated, not a whole torch file ({_torch_reason(err)})"
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in state.items()):
        return f"{path}: not a state dict of tensors (it holds a {type(state).__name__})"
    try:
        run_features(run, points=10)  # the figure's own model, on 10 samples
    except RuntimeError as err:
        if not str(err).startswith("Error(s) in loading state_dict"):
            raise
        detail = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        return f"{path}: does not fit the model of the run's config.yaml ({(detail or ['?'])[0][:200]})"
    return ""


def _torch_reason(err: BaseException) -> str:
    """A torch error's first sentence on one line, its type when that is all there is (or
    when it advises loading with weights_only=False)."""
    text = " ".join(str(err).split()).partition(". ")[0].strip()
    if not text or "weights_only" in text:
        return type(err).__name__
    return text if isinstance(err, RuntimeError) else f"{type(err).__name__}: {text}"


def build_report(root: Path, raw: Mapping[str, Any] | ReportOptions | None = None, html_path: str | Path | None = None,
                 echo: Echo = print, trust_plugins: bool = False) -> tuple[list[dict[str, Any]], Path]:
    """Tables, figures and ``report.html`` for the runs under ``root``; returns (rows, html path).

    ``trust_plugins``: import the plugins the runs' config.yaml name (their code runs); without
    it none is imported that is not imported already, and a line says which were left out.
    """
    with run_folders(trust_plugins) as untrusted:
        return _build_report(Path(root), raw, html_path, echo, untrusted)


def _build_report(root: Path, raw: Mapping[str, Any] | ReportOptions | None, html_path: str | Path | None,
                  echo: Echo, untrusted: list[str]) -> tuple[list[dict[str, Any]], Path]:
    from fedrift.engine.deployed_run import AGAIN, deployed

    notes: list[str] = []  # what was left out and why: printed, and at the top of the page

    def warn(line: str) -> None:
        notes.append(line)
        echo(line)

    skipped: list[str] = []
    groups, grid = load_groups(root, skipped)
    for line in skipped + _plugins_note(groups, untrusted):
        warn(line)
    opts = _merged_options(grid, raw)
    check_report_names(opts, list(dict.fromkeys(g.algorithm for g in groups)))
    for run in (r for g in groups for r in g.runs):
        said = str(run.summary.get("message") or "")
        if deployed(Path(run.dir)) and run.status not in ("completed", "missing"):  # no checkpoints, no --resume
            how = f"stopped after round {run.last_round}" if run.status == "interrupted" else \
                f"{run.status} after round {run.last_round}" + (f": {said}" if said else "")
            echo(f"{run.dir}: a deployed run, {how}; {AGAIN}")
        elif run.status == "interrupted":  # the run's own resume command (a lost Ray head's names the address)
            cont = said[said.index("continue with: "):] if "continue with: " in said else f"continue with: fedrift run --resume {run.dir}"
            echo(f"{run.dir}: interrupted after round {run.last_round}; {cont}")
    dest = root
    if (root / "config.yaml").is_file():  # a run folder: its files stay the run's own
        dest = root.parent / f"{root.name}-report"
        echo(f"{root}: a run folder: the report goes beside it, in {dest}")
        with _writing(dest):
            make_dir(dest, parents=False)
    rows, at_rounds, checked = _tables(dest, groups, opts, echo)
    with _writing(dest):
        plots = make_figures(dest, groups, opts, warn, rows) if opts.plots else []
    out = Path(html_path) if html_path is not None else dest / "report.html"
    page = render_html(root, groups, grid, rows, at_rounds, plots, opts, checked, notes)
    with _writing(root):
        make_dir(out.parent)
        write_atomic(out, page)
    return rows, out


def _writing(root: Path) -> Any:
    """A file of the report that cannot be written (a read-only folder, a full disk): one line."""
    return writing("report", f"; the runs in {root} are unchanged; allowed: a folder this user can write")


# ---------------------------------------------------------------------------------------
# HTML

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:2em auto;
max-width:1400px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.meta{color:#666;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .5em;text-align:right;white-space:nowrap}
table.fit{font-size:.8em}table.dense{font-size:.7em}table.fit td{white-space:normal}table.fit td,table.fit th{padding:.25em .25em}
th{background:#f1f3f6;white-space:normal;vertical-align:bottom}td:first-child,th:first-child{text-align:left}
tbody tr:nth-child(even){background:#fafbfc}
table.kv td{text-align:left;white-space:normal}table.kv td:first-child{font-weight:600;background:#f7f7f7}
figure{margin:1.2em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
details{margin:.3em 0}summary{cursor:pointer;font-weight:600}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
.note{color:#555;font-size:.9em}.scroll{overflow-x:auto}
.warn{color:#7a3e00;background:#fff4e5;border-left:4px solid #e08a00;padding:.4em .7em}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def cell(text: Any) -> str:
    """A table cell's HTML in a ``fit`` table, whose cells may wrap so that the table fits
    the page (a 1280 px window, any usual font) instead of scrolling: a number such as ``32.4 ±
    11.7`` or ``3.0 (1/2)`` breaks only before its ``±`` or ``(``, a size ``44.36 MB`` before
    its unit, words anywhere."""
    escaped = _e(text)
    if not re.match(r"[-+]?\d", str(text)):
        return escaped
    spaced = escaped.replace(" ", "&nbsp;").replace("&nbsp;±", " ±").replace("&nbsp;+-", " +-").replace("&nbsp;(", " (")
    return re.sub(r"&nbsp;([kMG]?B)$", r" \1", spaced)


def _img(png: Path, alt: str) -> str:
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _grid_rows(root: Path, groups: Sequence[Group], grid: dict[str, Any] | None) -> list[tuple[str, str]]:
    runs = [r for g in groups for r in g.runs]
    count = {s: sum(r.status == s for r in runs) for s in ("completed", "diverged", "interrupted", "missing")}
    status = ", ".join(f"{v} {k}" for k, v in count.items() if v)
    rows = [("runs folder", str(root.resolve()))]
    if grid:
        if grid.get("config"):
            rows.append(("config file", str(grid["config"])))
        rows.append(("algorithms", ", ".join(grid.get("algorithms", []))))
        rows.append(("seeds", ", ".join(str(s) for s in grid.get("seeds", []))))
        for k, vals in (grid.get("sweep") or {}).items():
            rows.append((f"sweep {k}", ", ".join(json.dumps(v) if not isinstance(v, str) else v for v in vals)))
        if grid.get("overrides"):
            rows.append(("overrides (every run)", " ".join(grid["overrides"])))
        tuned = grid.get("tuned") or {}
        for entry, values in (tuned.get("overrides") or {}).items():
            rows.append((f"tuned {entry} ({tuned.get('dir')})", " ".join(values)))
        rows += [("tuned values: warning", line.partition(": ")[2]) for line in tuned.get("warnings") or []]
    else:
        rows.append(("settings", f"{len(groups)} (runs grouped by config minus seed)"))
    rows.append(("runs", f"{len(runs)}: {status}"))
    return rows


def page_head(title: str, meta: str, generated: str | None = None) -> list[str]:
    """The opening of a self-contained page (report.html, tune.html, select.html): its title,
    the shared style, and a line of who wrote it when, with ``meta`` after; ``generated``: the
    time to show instead of this minute's (select.html gives its seconds and time zone)."""
    from fedrift.version import __version__

    now = generated or datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{_e(title)}</title>",
            f"<style>{CSS}</style>", "</head>", "<body>", f"<h1>{_e(title)}</h1>",
            f'<p class="meta">fedrift {_e(__version__)}, generated {_e(now)}{_e(meta)}</p>']


def _header(text: Any) -> str:
    """A column header that may also break after a ``/`` (``down/round``: the widest word of its column)."""
    return _e(text).replace("/", "/<wbr>")


DENSE = 20  # columns beyond which a table's text is set smaller (a results table with its worst 10%, rank, paper)


def fit_table(table_id: str, headers: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A table that wraps to fit the page (cells by :func:`cell`), scrolling only if it must;
    one of more than :data:`DENSE` columns in smaller type."""
    kind = "fit dense" if len(headers) > DENSE else "fit"
    return ['<div class="scroll">', f'<table id="{_e(table_id)}" class="{kind}">',
            "<thead><tr>" + "".join(f"<th>{_header(h)}</th>" for h in headers) + "</tr></thead>", "<tbody>",
            *("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows),
            "</tbody>", "</table>", "</div>"]


def render_html(root: Path, groups: Sequence[Group], grid: dict[str, Any] | None, rows: Sequence[dict[str, Any]],
                at_rounds: Sequence[int], plots: Sequence[Any], opts: ReportOptions,
                checked: Sequence[dict[str, Any]] = (), notes: Sequence[str] = ()) -> str:
    """The page; ``notes``: lines on what was left out (a skipped run folder, a figure's
    unreadable model file), shown at its top."""
    title = report_title(root, groups, opts)
    headers, cells = display_table(rows, at_rounds, pm="±")
    paper_note = published.note(rows, pm="±")
    table_note = " ".join(n for n in table_notes(rows, pm="±") if n != paper_note)  # worst 10%, rank, paired
    parts = [
        *page_head(title, ""),
        *(f'<p class="warn" id="skipped-{i + 1}">{_e(line)}</p>' for i, line in enumerate(notes)),
        *(f'<p class="warn" id="tuned-warning">{_e(line)}</p>' for line in ((grid or {}).get("tuned") or {}).get("warnings") or []),
        "<h2>Grid</h2>",
        '<table class="kv" id="grid"><tbody>',
        *(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in _grid_rows(root, groups, grid)),
        "</tbody></table>",
        "<h2>Results</h2>",
        *fit_table("results", headers, cells),
        '<p class="note">Accuracies in percent: mean ± sample standard deviation (ddof=1; the value alone for 1 seed) over the '
        "runs that completed; diverged runs are counted, not averaged. acc@r: the last evaluation at or before round r. "
        "Rounds to target: mean over the runs that reached it (how many in brackets)"
        + (f"; target rule {_e(_target(opts, groups))}" if _target(opts, groups) else "")
        + ". s/round: training seconds per round; wall s: the run's own time (start-up, rounds, evaluation); "
        "down/up: bytes per round. The same table is in "
        "results.csv (raw numbers) and results.md." + (f" {_e(table_note)}" if table_note else "") + "</p>",
        *([f'<p class="note" id="published">{_e(paper_note)}</p>'] if paper_note else []),
    ]
    if checked:
        claim_headers, claim_cells = claims.display(checked, pm="±")
        parts += [
            "<h2>Claims</h2>",
            *fit_table("claims", claim_headers, claim_cells),
            f'<p class="note">{_e(claims.note(checked, pm="±"))} The same table is in claims.csv and claims.md.</p>',
        ]
    if plots:
        parts.append("<h2>Figures</h2>")
        for p in plots:
            parts += [
                "<figure>",
                f"<h3>{_e(p.title)}</h3>",
                _img(p.png, p.title),
                f"<figcaption>{_e(p.caption)} (files: figures/{_e(Path(p.png).name)}, figures/{_e(Path(p.svg).name)})"
                "</figcaption>",
                "</figure>",
            ]
    parts.append("<h2>Configurations</h2>")
    parts.append('<p class="note">The resolved config.yaml of the first run of each setting (the other seeds differ '
                 "only in seed and output.dir).</p>")
    for g in groups:
        first = next((r for r in g.runs if (r.dir / "config.yaml").is_file()), None)
        text = (first.dir / "config.yaml").read_text() if first else "(no run of this setting on disk yet)"
        parts += [
            "<details>",
            f"<summary>{_e(g.label)}</summary>",
            f"<pre>{_e(text)}</pre>",
            "</details>",
        ]
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def check_report_names(opts: Any, algorithms: Sequence[str]) -> None:
    """Refuse, before anything runs, report options naming an algorithm the grid lacks."""
    names = list(algorithms)
    for alg in opts.tsne or []:
        if alg not in names:
            raise ConfigError(f"report.tsne: {alg!r} is not an algorithm of the grid; allowed: {', '.join(names)}, none")
    if opts.target != "auto":
        kind, alg, _ = parse_target(opts.target)
        if kind == "relative" and alg not in names:
            raise ConfigError(f"report.target: {alg!r} is not an algorithm of the grid; allowed: {', '.join(names)}")
    resolve_reference(opts.reference, names)  # refuses a reference the grid lacks
    claims.resolve_claims(opts.claims, names)  # and a claim about an algorithm it lacks


__all__ = ["ReportOptions", "build_report", "check_report_names", "fit_table", "page_head", "make_figures", "render_html", "report_title", "resolve_at_rounds", "write_tables"]
