"""The client-state store: the same answers in memory and on disk, bit for bit."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedrift
from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams
from fedrift.algorithms.fedavg import ce_loss
from fedrift.engine.sampling import SAMPLERS
from fedrift.engine.state import ClientStateError, ClientStateStore
from fedrift.functional.tree import leaves, weighted_sum
from fedrift.registry import Entry
from agreement import BITS, agree, untimed
from algorithm_cases import NAMES, build, case

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool, torch.complex64]
PARAMS = {"w": torch.zeros(2, 3)}


def _init(params):
    return {"c": {"w": torch.full((2, 3), -1.0)}, "n": torch.tensor(0, dtype=torch.int64)}


def _random_leaf(shape, dtype, g):
    """Random bit patterns (NaNs with payloads, -0.0, subnormals included); bools 0/1."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    size = torch.empty((), dtype=dtype).element_size()
    n = int(torch.tensor(shape).prod()) if shape else 1
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_identical(a[k], b[k])
            continue
        assert (a[k].dtype, a[k].shape, a[k].device) == (b[k].dtype, b[k].shape, b[k].device), k
        assert torch.equal(_bits(a[k]), _bits(b[k])), k


shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
specs = st.recursive(
    st.tuples(shapes, st.sampled_from(DTYPES)),
    lambda inner: st.dictionaries(st.sampled_from("abcxyz"), inner, min_size=0, max_size=3),
    max_leaves=6,
)
layouts = st.dictionaries(st.sampled_from(["c", "n", "m", "p"]), specs, min_size=1, max_size=3)


def _fill(spec, g):
    if isinstance(spec, dict):
        return {k: _fill(v, g) for k, v in spec.items()}
    return _random_leaf(*spec, g)


@pytest.mark.parametrize("mode", ["memory", "disk"])
@settings(max_examples=25, deadline=None)
@given(layout=layouts, seed=st.integers(0, 2**31 - 1), order=st.permutations(range(5)))
def test_round_trip_is_bit_exact(mode, layout, seed, order):
    g = torch.Generator().manual_seed(seed)
    states = {k: _fill(layout, g) for k in order[:4]}  # client order[4] is never put
    with ClientStateStore(lambda p: {"init": torch.ones(())}, PARAMS, mode=mode, num_clients=5) as store:
        for k, s in states.items():
            store.put(k, s)
        store.put(order[0], states[order[0]])  # a second put of the same client overwrites
        assert len(store) == 4
        for k, s in states.items():
            assert_identical(store.get(k), s)
        assert torch.equal(store.get(order[4])["init"], torch.ones(()))


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_mixed_dtypes_and_zero_dim_leaves(tmp_path, mode):
    state = {
        "c": {"w": torch.randn(2, 3, dtype=torch.float64), "b": torch.tensor(-0.0)},
        "n": torch.tensor(2**62 + 1, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "nested": {},
        "nan": torch.tensor([float("nan"), float("inf")], dtype=torch.float16),
    }
    with ClientStateStore(_init, PARAMS, mode=mode, path=tmp_path / "s.bin", num_clients=3) as store:
        store.put(1, state)
        assert_identical(store.get(1), state)
        assert store.get(1)["n"].item() == 2**62 + 1


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_unseen_clients_get_init_client(tmp_path, mode):
    with ClientStateStore(_init, PARAMS, mode=mode, path=tmp_path / "s.bin", num_clients=4) as store:
        assert_identical(store.get(0), _init(PARAMS))  # before any put
        store.put(2, {"c": {"w": torch.ones(2, 3)}, "n": torch.tensor(1)})
        for k in (0, 1, 3):
            assert_identical(store.get(k), _init(PARAMS))
        assert len(store) == 1


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_get_returns_copies(tmp_path, mode):
    state = {"c": {"w": torch.arange(6.0).reshape(2, 3)}, "n": torch.tensor(5)}
    keep = {"c": {"w": state["c"]["w"].clone()}, "n": state["n"].clone()}
    with ClientStateStore(_init, PARAMS, mode=mode, path=tmp_path / "s.bin", num_clients=4) as store:
        store.put(0, state)
        state["c"]["w"].add_(100)  # the caller's tensor changes after the put
        got = store.get(0)
        got["c"]["w"].zero_()
        got["n"].fill_(-1)
        again = store.get(0)
        assert_identical(again, keep)
        assert again["c"]["w"].data_ptr() != got["c"]["w"].data_ptr()


def test_auto_picks_disk_above_the_threshold(tmp_path):
    state = {"c": {"w": torch.ones(2, 3)}, "n": torch.tensor(1)}  # 24 + 8 bytes
    path = tmp_path / "s.bin"
    with ClientStateStore(_init, PARAMS, mode="auto", path=path, num_clients=4, threshold=4 * 32) as store:
        assert store.storage is None  # undecided until the first put
        store.put(1, state)
        assert store.storage == "memory" and not path.exists()  # 4 x 32 bytes: not above
    with ClientStateStore(_init, PARAMS, mode="auto", path=path, num_clients=4, threshold=4 * 32 - 1) as store:
        store.put(1, state)
        assert store.storage == "disk" and path.exists()
        assert_identical(store.get(1), state)
    with ClientStateStore(_init, PARAMS, mode="auto", path=path, num_clients=None, threshold=0) as store:
        store.put(1, state)
        assert store.storage == "memory"  # the federation's size unknown


def test_close_removes_the_file_and_ends_the_store(tmp_path):
    path = tmp_path / "s.bin"
    store = ClientStateStore(_init, PARAMS, mode="disk", path=path, num_clients=10_000)
    store.put(9_999, {"c": {"w": torch.ones(2, 3)}, "n": torch.tensor(1)})
    store.flush()
    assert path.stat().st_size == 10_000 * 32  # row 9,999 of 32 bytes; rows before it are holes
    store.close()
    assert not path.exists()
    store.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        store.get(0)


def test_unknown_federation_size_grows(tmp_path):
    with ClientStateStore(_init, PARAMS, mode="disk", path=tmp_path / "s.bin") as store:
        for k in (3, 70, 5):
            store.put(k, {"c": {"w": torch.full((2, 3), float(k))}, "n": torch.tensor(k)})
        assert len(store) == 3
        assert store.get(70)["n"].item() == 70 and store.get(5)["c"]["w"][0, 0].item() == 5.0
        assert_identical(store.get(71), _init(PARAMS))


def test_temporary_file_without_a_path():
    store = ClientStateStore(_init, PARAMS, mode="disk", num_clients=2)
    store.put(0, {"c": {"w": torch.ones(2, 3)}, "n": torch.tensor(1)})
    path = store._path
    assert path is not None and path.exists()
    store.close()
    assert not path.exists()


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_leaves_must_be_tensors(tmp_path, mode):
    with ClientStateStore(_init, PARAMS, mode=mode, path=tmp_path / "s.bin", num_clients=2) as store:
        with pytest.raises(ClientStateError, match=r"'c\.w' is a float.*must be tensors"):
            store.put(0, {"c": {"w": 1.0}})


def test_disk_refuses_a_second_layout(tmp_path):
    with ClientStateStore(_init, PARAMS, mode="disk", path=tmp_path / "s.bin", num_clients=3) as store:
        store.put(0, {"c": {"w": torch.ones(2, 3)}, "n": torch.tensor(1)})
        store.put(1, {"n": torch.tensor(2), "c": {"w": torch.ones(2, 3)}})  # another key order is the same layout
        assert store.get(1)["n"].item() == 2
        for bad in ({"c": {"w": torch.ones(3, 2)}, "n": torch.tensor(1)},
                    {"c": {"w": torch.ones(2, 3, dtype=torch.float64)}, "n": torch.tensor(1)},
                    {"c": {"w": torch.ones(2, 3)}}):
            with pytest.raises(ClientStateError, match="client 2's state has layout .*client_state=memory"):
                store.put(2, bad)
        with pytest.raises(ClientStateError, match="'n' is a int"):
            store.put(2, {"c": {"w": torch.ones(2, 3)}, "n": 1})


def test_client_ids_are_checked(tmp_path):
    with ClientStateStore(_init, PARAMS, mode="disk", path=tmp_path / "s.bin", num_clients=3) as store:
        with pytest.raises(IndexError):
            store.put(3, _init(PARAMS))
        with pytest.raises(IndexError):
            store.get(-1)


def test_no_state_algorithms_store_nothing(tmp_path):
    with ClientStateStore(None, PARAMS, mode="disk", path=tmp_path / "s.bin", num_clients=3) as store:
        store.put(0, {"w": torch.ones(1)})
        assert store.get(0) == {} and len(store) == 0 and not (tmp_path / "s.bin").exists()


# ---------------------------------------------------------------------------------------
# Through the engine: a SCAFFOLD-like toy whose state steers training


def _stateful(hp, setup):
    def init_server(params):
        return {"params": params, "visits": torch.zeros(setup.num_clients, dtype=torch.int64)}

    def init_client(params):
        return {"c": {k: torch.zeros_like(v) for k, v in params.items()},
                "visits": torch.tensor(0, dtype=torch.int64), "drift": torch.zeros((), dtype=torch.float64)}

    def grad_correction(grads, params, payload, ctx):
        return {k: g + 0.5 * ctx["state"]["c"][k] for k, g in grads.items()}

    def client_result(payload, end, ctx):
        old = ctx["state"]
        delta = {k: payload["params"][k] - end[k] for k in end}
        state = {"c": {k: 0.5 * old["c"][k] + delta[k] for k in end}, "visits": old["visits"] + 1,
                 "drift": old["drift"] + sum((d.double() ** 2).sum() for d in delta.values())}
        return {"params": end, "visits": state["visits"]}, state

    def aggregate(state, uploads, weights, info):
        visits = state["visits"].clone()
        visits[list(info.sampled)] = uploads["visits"]
        return {**state, "params": weighted_sum(uploads["params"], weights), "visits": visits}

    return Algorithm(name="stateful", hparams=hp, local_loss=ce_loss, init_server=init_server,
                     init_client=init_client, grad_correction=grad_correction,
                     client_result=client_result, aggregate=aggregate)


@pytest.mark.agreement
def test_disk_and_memory_runs_are_identical(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS._entries, "stateful", Entry("stateful", _stateful, "test only", AlgorithmParams))
    opened, real_open = [], ClientStateStore._open
    monkeypatch.setattr(ClientStateStore, "_open", lambda self, layout: (opened.append(self._path), real_open(self, layout)))
    rounds, results = 4, {}
    for mode in ("memory", "disk"):
        cfg = tiny(algorithm={"name": "stateful"}, engine={"client_state": mode},
                   train={"rounds": rounds, "clients_per_round": 3, "local_epochs": 1},
                   eval={"personalize": True, "personalize_epochs": 1, "personalize_loss": "algorithm"},
                   output={"dir": str(tmp_path / mode)})
        results[mode] = fedrift.run(cfg)
        assert not (tmp_path / mode / "client_state.bin").exists()  # removed at the end of the run
    assert opened == [tmp_path / "disk" / "client_state.bin"]  # the disk run used the file, the other none
    mem, disk = results["memory"], results["disk"]
    expected = torch.zeros(6, dtype=torch.int64)
    for t in range(1, rounds + 1):
        for k in SAMPLERS.get("uniform").factory(6, 3, 0, t, None):
            expected[k] += 1
    assert torch.equal(disk.server_state["visits"], expected)  # states persisted across rounds
    assert expected.max() > 1  # some client came back, so its state steered its training
    agree(mem.global_state, disk.global_state, BITS)
    agree(untimed(mem.history), untimed(disk.history), BITS)
    agree(mem.summary["personalized_accuracy"], disk.summary["personalized_accuracy"], BITS)
    assert all(torch.isfinite(t).all() for t in leaves(disk.global_state))


STATEFUL = [n for n in NAMES if build(n).init_client is not None]


def test_the_stateful_methods_keep_their_state_in_the_store():
    assert {"scaffold", "feddyn", "moon", "fedproto"} <= set(STATEFUL)


@pytest.mark.agreement
@pytest.mark.parametrize("name", STATEFUL)
def test_disk_client_state_gives_the_same_run_as_memory(tiny, tmp_path, monkeypatch, name):
    """4 rounds of 3 of 6 clients: clients come back, so their stored state is read again."""
    opened, real_open = [], ClientStateStore._open
    monkeypatch.setattr(ClientStateStore, "_open", lambda self, layout: (opened.append(self._path), real_open(self, layout)))
    runs = {}
    for mode in ("memory", "disk"):
        cfg = tiny(**case(name), engine={"client_state": mode}, train={"rounds": 4, "clients_per_round": 3},
                   output={"dir": str(tmp_path / mode)})
        runs[mode] = fedrift.run(cfg)
    assert opened == [tmp_path / "disk" / "client_state.bin"]  # the disk run kept its states in the file
    mem, disk = runs["memory"], runs["disk"]
    agree(mem.global_state, disk.global_state, BITS)
    agree(untimed(mem.history), untimed(disk.history), BITS)


@pytest.mark.parametrize("src", ["memory", "disk"])
@pytest.mark.parametrize("dst", ["memory", "disk"])
def test_dump_and_load_are_bit_exact_across_storages(tmp_path, src, dst):
    """A checkpoint's copy of the store (engine.checkpoint): every state put comes back with
    its bits, into a store of either storage; clients never put stay unseen."""
    g = torch.Generator().manual_seed(0)
    states = {k: {"c": {"w": _random_leaf((2, 3), torch.float32, g)}, "n": _random_leaf((), torch.int64, g)}
              for k in (3, 0, 4)}
    rows = tmp_path / "rows.bin"
    with ClientStateStore(_init, PARAMS, mode=src, path=tmp_path / "a.bin", num_clients=6) as store:
        for k, s in states.items():
            store.put(k, s)
        with open(rows, "wb") as f:
            dumped = store.dump(f)
    assert rows.stat().st_size == (3 * (6 * 4 + 8) if src == "disk" else 0)  # three rows, no holes
    with ClientStateStore(_init, PARAMS, mode=dst, path=tmp_path / "b.bin", num_clients=6) as store, open(rows, "rb") as f:
        store.load(dumped, f)
        assert len(store) == 3
        for k, s in states.items():
            assert_identical(store.get(k), s)
        assert_identical(store.get(1), _init(PARAMS))
