"""``engine.compile``: the vectorised step's stacked form compiled by ``torch.compile``
(engine/stacked_step.py): the stacked step's function, within float rounding; a run with it
reproducible; refused, in one line and before anything is written, where nothing would read it.
(A compile costs seconds of CPU a shape: these tests use the MLP and few shapes.)"""

from unittest import mock

import pytest

import fedrift
from agreement import BITS, agree, untimed
from fedrift.api import check_compile, prepare
from fedrift.engine.checkpoint import resumable_keys
from fedrift.engine.stacked_step import make_vstep
from fedrift.errors import ConfigError
from fedrift.models.mlp import MLP
from fedrift.models.resnet import ResNet8
from test_stacked_step import _tools  # the stacked step's tests' helper


@pytest.mark.process  # inductor compiles its kernels with the C++ compiler
@pytest.mark.agreement
def test_a_compiled_run_ends_where_the_uncompiled_run_does_and_again_bit_for_bit(tiny, tmp_path):
    """Batched, the tests' MLP federation under FedSAM (its ascent's gradient, taken inside the
    loss, goes through the stacked call's own backward, uncompiled; the descent through the
    compiled form's): compiled, within the batched tolerance of the same step uncompiled (the MLP's
    form switched on: FedModel.stacked_step); compiled twice (the second run takes torch's
    cached compile), equal bit for bit. One test: a compile's first costs a fresh process
    about 20 s of CPU."""
    def run(tag):
        return fedrift.run(tiny(engine={"executor": "batched", "compile": tag != "plain"}, algorithm={
            "name": "fedsam", "rho": 0.05}, train={"local_steps": 4},  # every group 3 wide: one compile
            output={"dir": str(tmp_path / tag)}))

    with mock.patch.object(MLP, "stacked_step", True):
        runs = {"plain": run("plain")}
    assert make_vstep(_tools("fedavg", {"name": "mlp", "hidden": [8]})[0], None) is None  # uncompiled: vmap's step
    from torch._dynamo.utils import counters  # here: fedrift first (fedrift._inductor_cache)

    made = counters["stats"]["unique_graphs"]
    runs.update({tag: run(tag) for tag in ("first", "again")})
    assert counters["stats"]["unique_graphs"] > made  # the step did go through torch.compile
    agree(runs["first"].global_state, runs["plain"].global_state)  # as the batched executor (docs/concepts/executors.md)
    agree(runs["again"].global_state, runs["first"].global_state, BITS)
    agree(untimed(runs["again"].history), untimed(runs["first"].history), BITS)


@pytest.mark.parametrize("sections,said", [
    ({"engine": {"executor": "sequential", "compile": True}}, "read by engine.executor batched and stacked only"),
    ({"engine": {"executor": "batched", "compile": True}, "model": {"name": "resnet8", "width": 4, "norm": "batch"}},
     "BatchNorm's running statistics"),
    ({"engine": {"executor": "batched", "compile": True}, "model": {"name": "mlp", "hidden": [8], "projection_dim": 4}},
     "MLP has no stacked form"),
    ({"engine": {"executor": "batched", "compile": True}, "privacy": {"level": "sample"}}, "DP-SGD"),
])
def test_compile_is_refused_where_nothing_reads_it(tiny, tmp_path, sections, said):
    """An executor without the vectorised step, a step that does not go through the stacked
    form: a config error in one line, before the run's folder is made."""
    with pytest.raises(ConfigError, match="engine.compile") as err:
        fedrift.run(tiny(**sections))
    assert said in str(err.value) and "\n" not in str(err.value) and "allowed" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_compile_under_auto_is_checked_once_auto_has_chosen(tiny):
    """``auto`` may choose an executor without the vectorised step for a run: then refused."""
    prep = prepare(tiny(engine={"compile": True}))
    model = ResNet8((1, 8, 8), 10, width=4, group_channels=2)
    with pytest.raises(ConfigError, match="auto chose processes for this run"):
        check_compile(prep.config, "processes", model)
    check_compile(prep.config, "batched", model)  # no error


def test_a_checkpoint_from_before_the_key_resumes_as_uncompiled():
    """Manifests written before ``engine.compile`` existed hold its default then (false)."""
    old = {"engine.executor": "batched", "seed": 0}
    assert resumable_keys(old) == resumable_keys({**old, "engine.compile": False})
    assert resumable_keys(old) != resumable_keys({**old, "engine.compile": True})


@pytest.mark.process  # inductor compiles its kernels with the C++ compiler
@pytest.mark.agreement
def test_stacked_runs_compiled_equal_the_runs_alone(tiny, tmp_path):
    """``stacked`` hands the key to its stack's step: two runs at other learning rates and
    FedProx mu, compiled, each client at its own values (engine.step_values), end where each
    ends alone under ``batched``, compiled too."""
    from fedrift.experiments.stacked import run_stacked

    def config(s, ex, tag):
        return tiny(seed=s, engine={"executor": ex, "compile": True}, algorithm={"name": "fedprox", "mu": 0.1 * (1 + 4 * s)},
                    train={"local_steps": 4, "lr": 0.05 / (1 + s)}, output={"dir": str(tmp_path / f"{tag}{s}")})

    from torch._dynamo.utils import counters  # here: fedrift first (fedrift._inductor_cache)

    made = counters["stats"]["unique_graphs"]
    together = run_stacked([config(s, "stacked", "t") for s in (0, 1)])
    assert counters["stats"]["unique_graphs"] > made
    for s, got in enumerate(together):
        alone = fedrift.run(config(s, "batched", "a"))
        agree(got.global_state, alone.global_state)


@pytest.mark.agreement
def test_a_compiled_group_is_padded_to_a_few_widths(tiny, tmp_path, monkeypatch):
    """Clients leave a group as their steps end; compiled, the group is padded to one of a few
    widths (as for captured graphs: ``step_graphs.width``), a compile each, not one for each
    number of clients left. Recorded with the uncompiled form in the compiled one's place;
    the padding rows' results are not read (the run ends where the unpadded one does)."""
    from fedrift.engine import stacked_step
    from fedrift.engine.step_graphs import width

    widths: list[int] = []

    def recorder(model):
        def form(model, p, x, mode):
            widths.append(x.shape[0])
            return type(model).stacked(model, p, x, mode)
        return form

    monkeypatch.setattr(stacked_step, "compiled_form", recorder)
    sections = dict(partition={"num_clients": 9, "alpha": 0.3}, train={"clients_per_round": 9, "rounds": 1})
    padded = fedrift.run(tiny(engine={"executor": "batched", "compile": True}, output={"dir": str(tmp_path / "c")},
                              **sections))
    assert widths[0] == 12 and set(widths) <= {width(n) for n in range(1, 10)} and len(set(widths)) > 2
    plain = fedrift.run(tiny(engine={"executor": "batched"}, output={"dir": str(tmp_path / "p")}, **sections))
    agree(padded.global_state, plain.global_state)


def test_a_cpu_capability_of_its_own_compiles_into_a_cache_of_its_own():
    """inductor's disk cache does not tell ``ATEN_CPU_CAPABILITY``'s vector widths apart
    (kernels of another width from the shared folder gave non-finite losses): under a
    capability set by hand, fedrift's import points the cache at a folder of that
    capability's own; not where the user named a folder, not where torch's compiler was
    loaded first (switched late, its parts would mix the folders), not without the variable."""
    from fedrift._inductor_cache import separate

    env = {"ATEN_CPU_CAPABILITY": "AVX2"}
    folder = separate(env, {})
    assert folder and folder.endswith("_avx2") and env["TORCHINDUCTOR_CACHE_DIR"] == folder
    mine = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/somewhere/mine"}
    assert separate(mine, {}) is None and mine["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/mine"
    late = {"ATEN_CPU_CAPABILITY": "avx2"}
    assert separate(late, {"torch._inductor": object()}) is None and "TORCHINDUCTOR_CACHE_DIR" not in late
    assert separate({}, {}) is None
