"""Streamed aggregation (``Algorithm.sums`` + ``aggregate_sums``): uploads folded into running
sums as clients finish, client states read as they start; the same global model, bit for bit,
as the round's uploads stacked whole."""

import pytest
import torch

import fedrift
from agreement import BITS, agree
from fedrift.algorithms.base import Algorithm, fedavg_aggregate, fedavg_sums
from fedrift.algorithms.fedavg import ce_loss
from fedrift.engine.executors import EXECUTORS
from fedrift.engine.executors.sequential import SequentialExecutor
from fedrift.registry import Entry


@pytest.mark.agreement
@pytest.mark.parametrize("algorithm,executor", [
    *[(a, "sequential") for a in ("fedavg", "scaffold", "fedgkd", "fedadc", "slowmo", "fedavgm")],
    ("fedavg", "batched"), ("scaffold", "batched"),
])
def test_streamed_sums_equal_the_stacked_aggregate_bit_for_bit(tiny, algorithm, executor):
    cfg = tiny(algorithm={"name": algorithm}, train={"rounds": 3, "clients_per_round": 4},
               engine={"executor": executor, "client_state": "disk"})
    streamed = fedrift.run(cfg)
    # accept_failures needs the round's uploads whole (a failed client changes the weights):
    # the stacked path, with no client failing here
    stacked = fedrift.run({**cfg, "engine": {**cfg["engine"], "accept_failures": True},
                           "output": {**cfg["output"], "dir": cfg["output"]["dir"] + "-stacked"}})
    agree(streamed.global_state, stacked.global_state, BITS)
    agree([r["test_accuracy"] for r in streamed.history], [r["test_accuracy"] for r in stacked.history], BITS)
    assert streamed.summary["bytes_up_total"] == stacked.summary["bytes_up_total"] > 0


class Spy(SequentialExecutor):
    """Records, as each client finishes, how many earlier outputs still hold their upload,
    and whether the jobs came with their states already read."""

    seen: list = []

    def run_round(self, tools, payload, jobs, round_, take=None):
        Spy.seen.append(("states read at open", sum(bool(j.ctx["state"]) for j in jobs)))

        made: list = []

        def spy(out):
            made.append(out)
            take(out)
            Spy.seen.append(("uploads held", sum(bool(o.upload) or o.state is not None for o in made)))

        return super().run_round(tools, payload, jobs, round_, take=spy if take else None)


def test_a_round_holds_one_upload_and_reads_each_state_when_its_client_trains(tiny, monkeypatch):
    monkeypatch.setitem(EXECUTORS._entries, "spy", Entry("spy", lambda cfg: Spy(), "test only", None))
    Spy.seen = []
    r = fedrift.run(tiny(algorithm={"name": "scaffold"}, train={"rounds": 3, "clients_per_round": 4},
                         engine={"executor": "spy"}))
    held = [n for what, n in Spy.seen if what == "uploads held"]
    read = [n for what, n in Spy.seen if what == "states read at open"]
    assert len(held) == 12 and max(held) == 0  # each upload folded and dropped as it came
    assert read == [0, 0, 0]  # no job carries its state: read when the client starts
    # the stacked path, by contrast, keeps every output whole until the round closes
    Spy.seen = []
    fedrift.run(tiny(algorithm={"name": "scaffold"}, train={"rounds": 1, "clients_per_round": 4},
                     engine={"executor": "spy", "accept_failures": True}, output={"dir": str(r.output_dir) + "-2"}))
    assert [n for what, n in Spy.seen if what == "states read at open"] == [4]


def test_an_algorithm_gives_one_aggregate():
    alg = Algorithm(name="a", hparams=None, local_loss=ce_loss)
    assert alg.sums == {"params": "weights"} and alg.aggregate_sums is fedavg_sums  # FedAvg's, streamed
    custom = Algorithm(name="b", hparams=None, local_loss=ce_loss, aggregate=lambda s, u, w, i: s)
    assert custom.sums is None and custom.aggregate_sums is None  # its own aggregate: stacked
    with pytest.raises(ValueError, match="not both"):
        Algorithm(name="c", hparams=None, local_loss=ce_loss, aggregate=lambda s, u, w, i: s,
                  sums={"params": "weights"}, aggregate_sums=fedavg_sums)
    with pytest.raises(ValueError, match="give both or neither"):
        Algorithm(name="d", hparams=None, local_loss=ce_loss, aggregate=lambda s, u, w, i: s, sums={"params": "weights"})
    # the derived stacked aggregate is FedAvg's weighted mean
    uploads = {"params": {"w": torch.tensor([[1.0, 2.0], [3.0, 6.0]])}}
    out = alg.aggregate({"params": {}}, uploads, torch.tensor([0.5, 0.5], dtype=torch.float64), None)
    assert torch.equal(out["params"]["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(fedavg_aggregate({}, uploads, torch.tensor([0.5, 0.5]), None)["params"]["w"], out["params"]["w"])
