"""The generated reference follows the code: change a default, an option or an argument and
the page changes with it (docs/_ext/fedrift_reference.py)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fedrift_reference", ROOT / "docs" / "_ext" / "fedrift_reference.py")
ref = importlib.util.module_from_spec(_spec)
sys.modules["fedrift_reference"] = ref
_spec.loader.exec_module(ref)


def _row(page: str, key: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))


def test_every_config_key_has_a_description():
    from fedrift.config import Config

    assert ref.missing_descriptions(Config) == []


def test_every_report_option_has_a_description_and_a_row():
    from fedrift.report.html import ReportOptions

    assert ref.missing_option_descriptions(ReportOptions, "report") == []
    page = ref.options_page(ReportOptions, "report")
    assert len([line for line in page.splitlines() if line.startswith("| `report.")]) == len(ReportOptions.model_fields)
    row = _row(page, "report.metric")
    assert "`accuracy`, `local_accuracy`, `local_accuracy_worst10`, `null`" in row and "| `null` |" in row
    assert "worst 10%" in row
    assert _row(page, "report.tsne_points").startswith("| `report.tsne_points` | int | `1000` | >= 10 |")


def test_changing_a_default_changes_the_config_page(monkeypatch):
    from fedrift.config import Config, TrainConfig

    before = ref.config_page(Config)
    old = TrainConfig.model_fields["rounds"].default
    assert _row(before, "train.rounds") == f"| `train.rounds` | int | `{old}` | >= 1 | communication rounds |"
    # the same model with another default, as an edit of config.py would give
    patched = TrainConfig.model_fields["rounds"].__class__.merge_field_infos(TrainConfig.model_fields["rounds"],
                                                                              default=old + 7)
    monkeypatch.setitem(TrainConfig.model_fields, "rounds", patched)
    after = ref.config_page(Config)
    assert _row(after, "train.rounds") == f"| `train.rounds` | int | `{old + 7}` | >= 1 | communication rounds |"
    assert [line for line in before.splitlines() if "train.rounds" not in line] == \
        [line for line in after.splitlines() if "train.rounds" not in line]


def test_a_new_key_appears_with_its_type_bounds_choices_and_description():
    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        share: Annotated[float, Field(gt=0, le=1, description="a share")] = 0.5
        mode: Literal["a", "b"] = Field("a", description="a mode")
        cap: int | None = Field(None)

    class Top(BaseModel):
        seed: int = Field(3, description="the seed")
        part: Section = Field(Section(), description="a section")

    page = ref.config_page(Top)
    assert _row(page, "seed") == "| `seed` | int | `3` |  | the seed |"
    assert _row(page, "part.share") == "| `part.share` | float | `0.5` | > 0, <= 1 | a share |"
    assert _row(page, "part.mode") == "| `part.mode` | choice | `a` | `a`, `b` | a mode |"
    assert ref.missing_descriptions(Top) == ["part.cap"]  # the build fails on it


def test_the_algorithm_page_follows_the_registry():
    from fedrift.params import params
    from fedrift.registry import Registry

    @params
    class ToyParams:
        """tau: how strongly."""

        tau: Annotated[float, Field(ge=0)] = 1.5

    def toy(hp, setup):
        return None

    registry = Registry("algorithm")
    registry.register("toy", "a toy remedy", ToyParams, source="built in",  # as fedrift's own modules register
                      space={"tau": "log:0.1:10"})(toy)
    parts = ref.algorithms_page(registry, lambda name: {"train.lr": "log:0.005:0.5", "algorithm.tau": "log:0.1:10"})
    assert list(parts) == [ref.algorithm_family(toy.__module__)]  # one part per module, by its last name
    page = parts[ref.algorithm_family(toy.__module__)]
    assert "(algorithm-toy)=\n### `toy`" in page and "a toy remedy" in page
    assert "| `tau` | float | `1.5` | >= 0 | how strongly. |" in page  # the meaning, from the docstring
    assert "```" not in page  # no docstring in a monospace block: the prose pages explain the method
    assert "Tuning space (`fedrift tune`): `train.lr` `log:0.005:0.5`, `algorithm.tau` `log:0.1:10`." in page


def test_option_meanings_come_from_the_options_docstrings_as_markdown():
    """Each option's paragraph of its class's docstring (a subclass's wins over its base's), on
    one line, with reST's ``code`` and :role:`name` as Markdown code; the heading left out."""
    from fedrift.params import params

    @params
    class BaseParams:
        """Options of the base (left out).

        a: the ``a`` knob,
            continued on a second line.
        b: see :func:`fedrift.run`.
        """

        a: float = 1.0
        b: int = 2

    @params
    class SubParams(BaseParams):
        """The above, and

        b: overridden here.
        c: a new one.
        """

        c: str = "x"

    assert ref.option_meanings(SubParams) == {"a": "the `a` knob, continued on a second line.",
                                              "b": "overridden here.", "c": "a new one."}
    table = ref.options_table(SubParams, ref.option_meanings(SubParams))
    assert table[0] == "| option | type | default | allowed | meaning |"
    assert "| `a` | float | `1.0` |  | the `a` knob, continued on a second line. |" in table


def test_every_algorithm_module_has_a_prose_page():
    """Each module that defines algorithms has its generated part included by a page of
    docs/reference/algorithms/ (the build fails otherwise): no algorithm without its prose."""
    assert ref.families_without_a_page() == []


def test_the_cli_page_follows_the_parser():
    p = argparse.ArgumentParser(prog="fedrift", description="d")
    sub = p.add_subparsers()
    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("--jobs", type=int, default=3, help="runs at once")
    page = ref.cli_page(p)
    assert "## `fedrift run`" in page and "| `--jobs JOBS` | `3` |  | runs at once |" in page


def test_prose_from_the_code_shows_as_written():
    """Help and descriptions are plain text: their <, >, _ and * are not Markdown (an
    OUT/<setting>/seed<k> would vanish as an HTML tag); `code` spans stay code."""
    assert ref.text("OUT/<setting>/seed<k>, val_share, mu * w") == "OUT/\\<setting\\>/seed\\<k\\>, val\\_share, mu \\* w"
    assert ref.text("see `runs/<algorithm>` and a_b") == "see `runs/<algorithm>` and a\\_b"
