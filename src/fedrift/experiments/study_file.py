"""A study file: one paper table (or one's own) as a YAML file that ``fedrift study run`` reproduces.

The file names the base config and every choice a table's reproduction makes::

    base: fedgkd-table3-cifar10.yaml        # a config file (beside this file), or the config inline
    overrides: {train.rounds: 40}           # every run and trial (output.* keys: the runs only)
    entries:                                # compare's entry syntax: name[:option=value[:section.key=value]]
      - fedavg
      - fedprox:mu=0.01:train.momentum=0
      - {entry: fedgkd, space: {gamma: none}}   # its own tuning space, added to the study's
      - {entry: fedadc, tune: false}            # not tuned: the `tuned:` file's values, else the config's
    reference: fedavg                       # run first, the report's reference (default: the first entry)
    seeds: [0, 1, 2]
    sweep: {partition.alpha: [0.1, 0.5]}
    tune:                                   # tune every entry (but tune: false ones) before its runs
      space: {train.lr: [0.01, 0.05, 0.1], gamma: none}   # fedrift tune's space.KEY=SPEC
      rounds: 20                            # the tuning horizon (train.rounds of each trial)
      seed: 0                               # the trials' config seed (default: the base's)
      trials: 8
      overrides: {partition.val_share: 0.1} # the trials only
    tuned: ../tuned/workload-b.yaml         # values for the entries the study does not tune
    report: {paper: fedgkd-table3-cifar10, claims: [papers], at_rounds: [10, 20, 40]}
    out: ../results                         # default: runs/study-<file name less .study.yaml> (from here)
    folders: {tune: tune, runs: runs}       # the tune folder and the compare root under out
    jobs: 2                                 # default --jobs

The tune runs on the base config with the study's overrides and the tune's (``rounds``, ``seed``,
``overrides``); a swept key keeps the base's value there, and the values chosen serve every swept
value. An entry's own options (``fedprox:mu=0.01``) are fixed: its tune does not search them.

Paths in the file (``base``, ``tuned``, ``out``) are relative to the file's folder; paths inside
the config (``data.root``) keep their own meaning (relative to the current folder). Everything
is checked when the file is read, before any data is loaded: an unknown key, algorithm, report
option or published table, a bad space or sweep, a reference that is not an entry, each refused
in one line. (The configs of the runs and trials are validated next, before anything runs, by
``compare``'s and ``tune``'s own checks.)

Each entry's *settings* (:func:`entry_settings`: its entry string, the base config it runs on,
its tuning or the values it takes) are hashed; ``fedrift study`` stores the hashes beside the
results to say which entries changed since the last run.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedrift.config import apply_overrides, check_numbers, config_dict, plugin_list, read_yaml
from fedrift.errors import ConfigError
from fedrift.experiments.naming import safe_name
from fedrift.experiments.space import Dim, default_space, resolve_space, takes
from fedrift.experiments.tuned import read_tuned
from fedrift.overrides import parse_algorithm

NonNegInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]
_STRICT = ConfigDict(extra="forbid", frozen=True)


class TuneSection(BaseModel):
    """``tune:``: what every tuned entry's study searches, and on what runs."""

    model_config = _STRICT
    space: dict[str, Any] = {}
    rounds: PositiveInt | None = None
    seed: NonNegInt | None = None
    trials: PositiveInt = 20
    overrides: dict[str, Any] = {}
    pruner: Literal["median", "none"] = "median"


class EntrySection(BaseModel):
    """An entry given as a mapping: the entry string, whether it is tuned, its own space."""

    model_config = _STRICT
    entry: str
    tune: bool = True
    space: dict[str, Any] = {}


class FoldersSection(BaseModel):
    model_config = _STRICT
    tune: str = "tune"
    runs: str = "runs"


class StudyFile(BaseModel):
    """The study file as written (see the module docstring)."""

    model_config = _STRICT
    base: Union[str, dict[str, Any]]
    overrides: dict[str, Any] = {}
    entries: list[Union[str, EntrySection]] = Field(min_length=1)
    reference: str | None = None
    seeds: list[NonNegInt] = [0]
    sweep: dict[str, list[Any]] = {}
    tune: TuneSection | None = None
    tuned: str | None = None
    report: dict[str, Any] = {}
    out: str | None = None
    folders: FoldersSection = FoldersSection()
    jobs: PositiveInt = 1


@dataclass(frozen=True)
class Entry:
    """One entry of the study, resolved: its string, whether the study tunes it, its space."""

    entry: str
    tuned: bool
    space: dict[str, Any] = field(default_factory=dict)  # the study's space with the entry's own

    @property
    def name(self) -> str:
        return parse_algorithm(self.entry)[0]

    @property
    def study_name(self) -> str:
        """Its study's name in the tune folder (``fedrift tune``'s rule)."""
        return safe_name(self.entry.replace(":", "-"))


@dataclass
class Study:
    """A study file read and checked: what ``fedrift study run`` and ``status`` work from."""

    path: Path
    file: StudyFile
    config: str | dict[str, Any]  # the base: a config file's path (as compare records it) or a mapping
    base: dict[str, Any]  # the base config with the study's overrides
    overrides: list[str]  # the study's overrides as key=value (every run; output.* not for the trials)
    entries: list[Entry]  # reference first, then the file's order
    seeds: list[int]
    sweep: dict[str, list[Any]]
    tune_overrides: list[str]  # the trials': the study's (less output.*), the tune's, its rounds and seed
    table: dict[str, dict[str, Any]]  # the `tuned:` file's values per entry ({} without one)
    tuned_path: Path | None
    report: dict[str, Any]  # report.* options, the reference among them
    out: Path
    tune_dir: Path
    runs_dir: Path

    @property
    def reference(self) -> Entry:
        return self.entries[0]

    @property
    def tuned_entries(self) -> list[Entry]:
        return [e for e in self.entries if e.tuned]

    def table_values(self, entry: Entry) -> dict[str, Any] | None:
        """The ``tuned:`` file's values for an entry the study does not tune (by entry, else by
        algorithm name, as ``compare ... tuned=`` reads them), or None."""
        by_name = {parse_algorithm(e)[0]: v for e, v in self.table.items()}
        return self.table.get(entry.entry) or by_name.get(entry.name)

    def settings(self, entry: Entry) -> dict[str, Any]:
        """What an entry's results depend on (its hash's input; seeds and sweep values only add runs)."""
        out: dict[str, Any] = {"entry": entry.entry, "base": self.base}
        if entry.tuned and self.file.tune is not None:
            t = self.file.tune
            out["tune"] = {"space": entry.space, "rounds": t.rounds, "seed": t.seed, "overrides": self.tune_overrides,
                           "pruner": t.pruner}
        else:
            values = self.table_values(entry)
            out["values"] = None if values is None else values.get("overrides")
        return out

    def entry_hash(self, entry: Entry) -> str:
        return hashlib.sha1(json.dumps(self.settings(entry), sort_keys=True, default=str).encode()).hexdigest()[:12]


def _as_overrides(values: Mapping[str, Any], where: str) -> list[str]:
    out = []
    for key, value in values.items():
        if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"{where}: {key!r} is not a dotted config key (e.g. train.rounds: 40)")
        out.append(f"{key}={json.dumps(value)}")
    return out


_SECTIONS: dict[str, type[BaseModel]] = {"tune": TuneSection, "folders": FoldersSection, "entries": EntrySection}


def _one_line(err: ValidationError, where: str) -> str:
    """A study file's validation error as one line naming the key and what is allowed (an
    entry's mapping errors before its string alternative's: the mapping is what was written)."""
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), None) or next(
        (e for e in errors if "str" not in [str(p) for p in e["loc"]]), errors[0])
    loc = [str(p) for p in first["loc"] if str(p) not in ("str", "EntrySection")]
    key = ".".join(loc) or "the file"
    if first["type"] == "extra_forbidden":
        model = _SECTIONS.get(loc[0], StudyFile) if len(loc) > 1 else StudyFile
        return f"{where}: {key}: unknown key; allowed: {', '.join(model.model_fields)}"
    if first["type"] == "missing":
        return f"{where}: {key}: missing; a study file needs base: (a config) and entries: (a list)"
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    return f"{where}: {key}: {first['msg'].lower()}{shown}"


def _entries(file: StudyFile, where: str) -> list[Entry]:
    from fedrift.algorithms import ALGORITHMS

    out: list[Entry] = []
    study_space = dict(file.tune.space) if file.tune is not None else {}
    for item in file.entries:
        spec = item if isinstance(item, EntrySection) else EntrySection(entry=item)
        name, _ = parse_algorithm(spec.entry)
        ALGORITHMS.get(name, f"{where}: entries: {spec.entry}")
        if spec.space and file.tune is None:
            raise ConfigError(f"{where}: entries: {spec.entry}: space: without a tune: section nothing is tuned; "
                              "allowed: a tune: section, or no space")
        space = {k: v for k, v in {**study_space, **spec.space}.items() if "." in k or takes(name, k)}
        for option in parse_algorithm(spec.entry)[1]:  # a value the entry fixes is not tuned
            key = option.partition("=")[0].strip()
            key = key[len("algorithm."):] if key.startswith("algorithm.") else key
            if key in spec.space:
                raise ConfigError(f"{where}: entries: {spec.entry}: space.{key}: the entry fixes {key}; allowed: "
                                  "a value in the entry or a space, not both")
            space[key] = "none"
        tuned = file.tune is not None and spec.tune
        if tuned:
            for key, value in spec.space.items():
                if "." not in key and not takes(name, key):
                    raise ConfigError(f"{where}: entries: {spec.entry}: space.{key}: {name} has no option {key!r}")
            for key, value in {**default_space(name), **space}.items():
                dotted = key if "." in key else f"algorithm.{key}"
                if value is None or str(value).strip().lower() == "none":
                    continue
                kind = str(value).partition(":")[0].strip() if isinstance(value, str) and ":" in value else None
                if kind is not None and kind not in ("log", "float", "int"):
                    raise ConfigError(f"{where}: tune space of {spec.entry}: space.{key}: {value!r} is not a space; "
                                      "allowed: log:LOW:HIGH, float:LOW:HIGH, int:LOW:HIGH or a list of values")
                try:
                    Dim.parse(dotted, value)  # a bad space is refused now, in one line
                except ConfigError as err:
                    raise ConfigError(f"{where}: tune space of {spec.entry}: {err}") from None
            try:
                resolve_space(name, space)
            except ConfigError as err:  # it fixes every key its tune would search
                raise ConfigError(f"{where}: entries: {spec.entry}: {err}, or tune: false for this entry") from None
        if any(e.entry == spec.entry for e in out):
            raise ConfigError(f"{where}: entries: {spec.entry} given twice")
        out.append(Entry(spec.entry, tuned, space if tuned else {}))
    return out


def _command_overrides(tokens: Sequence[str], file: StudyFile) -> tuple[list[str], list[int] | None]:
    """The command line's ``key=value`` tokens, checked as the file's ``overrides:`` are, and
    the seeds of a ``seeds=0,1`` (which replaces the file's)."""
    from fedrift.overrides import parse_value, split_list

    out, seeds = [], None
    for token in tokens:
        key, sep, raw = token.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"study run: {token!r} is not of the form key=value; allowed: a config key and its "
                              "value, e.g. train.rounds=20, or seeds=0,1")
        if key == "seeds":
            seeds = [parse_value(v) for v in split_list(raw)]
            if not seeds or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in seeds):
                raise ConfigError(f"study run: seeds={raw}: allowed: distinct integers >= 0, e.g. seeds=0,1")
            continue
        if key in ("seed", "algorithm.name", "output.dir") or key.startswith(("sweep.", "algorithm.")):
            raise ConfigError(f"study run: {key}: the study file sets it (sweep:, entries:, out:); allowed: "
                              "other config keys and seeds, e.g. train.rounds=20 seeds=0")
        if key in file.sweep:
            raise ConfigError(f"study run: {key}: both swept by the study and given here; allowed: other keys")
        out.append(f"{key}={token.partition('=')[2]}")
    return out, seeds


def load_study(path: str | Path, out: str | Path | None = None, overrides: Sequence[str] = ()) -> Study:
    """Read and check a study file (nothing is run, no data is loaded); ``out`` replaces its
    ``out:``; ``overrides`` (``key=value``, the command line's) join its ``overrides:``, for
    every entry, run and trial (``output.*``: the runs only)."""
    from fedrift.plugins import load_plugins
    from fedrift.report.html import ReportOptions, check_report_names

    path = Path(path)
    where = f"study file {str(path)!r}"
    raw = read_yaml(path)
    try:
        file = StudyFile.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_one_line(err, where)) from None
    try:  # the study's own numbers (trials, rounds, seeds, jobs) as a config's: finite, within bounds
        check_numbers(file.model_dump(include={"seeds", "jobs"}), "")
        check_numbers(file.tune.model_dump(include={"rounds", "seed", "trials"}) if file.tune else {}, "tune")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    here = path.parent

    def beside(name: str) -> Path:  # a path of the file, relative to its folder
        return Path(os.path.normpath(here / name))

    if isinstance(file.base, str):
        base_path = beside(file.base)
        if not base_path.is_file():
            raise ConfigError(f"{where}: base: {str(base_path)!r} is not a file; allowed: a config file (a path "
                              "relative to the study file) or the config as a mapping")
        config: str | dict[str, Any] = str(base_path)
    else:
        config = dict(file.base)
    command, seeds = _command_overrides(overrides, file)
    if seeds is not None:
        file = file.model_copy(update={"seeds": seeds})
    overrides = _as_overrides(file.overrides, f"{where}: overrides") + command
    base = apply_overrides(config_dict(config), overrides)
    load_plugins(plugin_list(base.get("plugins")))  # an algorithm a plugin adds is then known
    entries = _entries(file, where)
    names = [e.entry for e in entries]
    ref = file.reference if file.reference is not None else names[0]
    if ref not in names:
        raise ConfigError(f"{where}: reference: {ref!r} is not an entry; allowed: {', '.join(names)}")
    entries.sort(key=lambda e: e.entry != ref)  # the reference first, the others in the file's order
    if len(set(file.seeds)) != len(file.seeds) or not file.seeds:
        raise ConfigError(f"{where}: seeds: a seed given twice or none; allowed: distinct integers >= 0, e.g. [0, 1, 2]")
    for key, values in file.sweep.items():
        if not values:
            raise ConfigError(f"{where}: sweep.{key}: no values given")
    for key in file.overrides:
        if key in file.sweep:
            raise ConfigError(f"{where}: {key}: both swept and overridden; give it one way")
        if key in ("seed", "algorithm.name") or key == "output.dir":
            raise ConfigError(f"{where}: overrides: {key}: the study sets it (seeds:, entries:, out:); allowed: other keys")
    tune_overrides: list[str] = []
    if file.tune is not None:
        t = file.tune
        tune_overrides = [o for o in overrides if not o.startswith("output.")]
        tune_overrides += _as_overrides(t.overrides, f"{where}: tune.overrides")
        tune_overrides += [f"train.rounds={t.rounds}"] if t.rounds is not None else []
        tune_overrides += [f"seed={t.seed}"] if t.seed is not None else []
        for key in t.space:
            if "." not in key and not any(takes(e.name, key) for e in entries):
                raise ConfigError(f"{where}: tune.space.{key}: no entry takes {key!r}; a dotted key (e.g. train.lr) "
                                  "names any config key")
    report = dict(file.report)
    report.setdefault("reference", ref)
    opts = ReportOptions.parse(report)  # an unknown option or published table is refused here
    check_report_names(opts, names)
    tuned_path = beside(file.tuned) if file.tuned is not None else None
    table = read_tuned(tuned_path) if tuned_path is not None else {}
    stem = path.stem[: -len(".study")] if path.stem.endswith(".study") else path.stem  # x.study.yaml: study-x
    root = Path(out) if out is not None else beside(file.out) if file.out is not None else Path("runs") / f"study-{stem}"
    return Study(path, file, config, base, overrides, entries, list(file.seeds), dict(file.sweep), tune_overrides,
                 table, tuned_path, report, root, root / file.folders.tune, root / file.folders.runs)


__all__ = ["Entry", "Study", "StudyFile", "load_study"]
