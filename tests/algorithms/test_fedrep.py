"""FedRep (algorithms/fedrep.py): the head phase's length; the phased optimiser by hand against
torch's SGD with the frozen part's gradient left out (a frozen tensor keeps its bits and its
momentum); a client's round against that reference on its real batches; head_epochs 0 trains
exactly as FedBABU, the whole run bit for bit, each client's head staying the initial one; its
own SGD (FedBABU's too) refuses train.optimizer adamw in one line. The executors run it through
tests/engine/algorithm_cases.py; test_learning.py that it learns."""

from __future__ import annotations

import pytest
import torch
from agreement import BITS, ROUNDING, agree
from conftest import one_line_refusal
from partial_sharing import one_round, server_of, two_layer_apply, two_layers

import fedrift
from fedrift.algorithms.fedrep import head_steps, phased_sgd
from fedrift.algorithms.terms import weighted_ce

HEAD = frozenset({"fc.weight", "fc.bias"})


def test_the_head_phase_is_its_share_of_the_steps_and_exactly_its_epochs():
    steps = torch.tensor([0.0, 1.0, 5.0, 11.0, 13.0 * 11, 7.0 * 15])
    assert head_steps(steps, 10, 1).tolist() == [0, 0, 4, 10, 130, 1050 // 11]
    assert head_steps(torch.tensor(7.0 * 15), 10, 5).item() == 70  # 15 epochs of 7 steps: 10 of head, 5 of body
    assert head_steps(torch.tensor(9.0), 0, 1).item() == 0


def _torch_reference(start, batches, limit, lr, momentum, wd, clip, head=HEAD):
    """torch's SGD over the whole model, the frozen part's gradient set to None each step."""
    params = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr, momentum=momentum, weight_decay=wd)
    for s, loss_of in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss_of(params).backward()
        for k, p in params.items():
            if (k in head) != (s < limit):
                p.grad = None
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.grad is not None], clip)
        opt.step()
    return {k: v.detach() for k, v in params.items()}


@pytest.mark.agreement
@pytest.mark.parametrize("clip", [None, 0.5])
def test_the_phased_optimiser_trains_the_head_then_the_body_as_torch_does_with_the_other_frozen(clip):
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(5)]
    batches = [lambda p, x=x, y=y: weighted_ce(two_layer_apply(p, x), y, torch.full((6,), 1 / 6)) for x, y in data]
    lr, momentum, wd, limit = 0.1, 0.9, 0.01, 2
    opt = phased_sgd(lr, momentum, wd, clip, lambda p: HEAD)
    params = two_layers()
    state = {**opt.init(params), "head_steps": torch.tensor(float(limit))}  # as FedRep's optimizer_start sets it
    for s, loss_of in enumerate(batches):
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        grads = dict(zip(leaves, torch.autograd.grad(loss_of(leaves), list(leaves.values()))))
        updates, state = opt.update(grads, state, params)
        new = {k: params[k] + updates[k] for k in params}
        for k in params:  # a frozen tensor keeps its bits, a trained one moves
            assert torch.equal(new[k], params[k]) == ((k in HEAD) != (s < limit)), (s, k)
        params = new
    agree(params, _torch_reference(two_layers(), batches, limit, lr, momentum, wd, clip), ROUNDING)


@pytest.mark.agreement
def test_a_clients_round_is_head_epochs_then_body_epochs_on_its_real_batches(tiny, tmp_path):
    """Two local epochs, head_epochs 1 and body_epochs 1: the first epoch trains the head alone,
    the second the body alone, as torch's SGD does with the other part's gradient left out."""
    sections = dict(algorithm={"name": "fedrep", "head_epochs": 1, "body_epochs": 1},
                    train={"local_epochs": 2, "rounds": 1})
    with server_of(tiny, tmp_path, "rep", **sections) as (server, w0):
        rnd, outputs = one_round(server, 1)
        tools, tc = rnd.tools, server.cfg.train
        for job, out in list(zip(rnd.jobs, outputs))[:2]:
            ctx = job.context()
            start = tools.start_params(rnd.payload, ctx)
            steps = len(job.schedule)
            assert steps % 2 == 0 and head_steps(ctx["num_steps"], 1, 1).item() == steps // 2

            def loss_of(p, idx):
                batch = tools.batch(rnd.payload, idx, torch.full((idx.numel(),), 1.0 / idx.numel()))
                return tools.algorithm.local_loss(p, batch, rnd.payload, ctx, tools.apply)[0]

            batches = [lambda p, idx=idx: loss_of(p, idx) for idx in job.schedule]
            ref = _torch_reference(start, batches, steps // 2, tc.lr, tc.momentum, tc.weight_decay, tc.clip_grad_norm)
            agree(out.end_params, ref, ROUNDING, where=f"client {job.client_id}")
            assert all(not torch.equal(out.end_params[k], start[k]) for k in start)  # both phases ran


@pytest.mark.agreement
def test_with_no_head_epochs_it_trains_exactly_as_fedbabu(tiny, tmp_path):
    """Round after round the server states agree bit for bit (the body averaged alike, the
    server's head the initial one), and every client's head stays the initial one."""
    sections = dict(train={"rounds": 3, "clients_per_round": 4})
    with server_of(tiny, tmp_path, "rep", algorithm={"name": "fedrep", "head_epochs": 0}, **sections) as (rep, w0), \
            server_of(tiny, tmp_path, "babu", algorithm={"name": "fedbabu"}, **sections) as (babu, _):
        for t in rep.rounds():
            for server in (rep, babu):
                rnd, outputs = one_round(server, t)
                server.close(rnd, outputs, [])
            agree(rep.state["params"], babu.state["params"], BITS, where=f"round {t}")
            for k in rnd.sampled:
                own = rep.store.get(k)["own"]
                assert all(torch.equal(own[n], w0[n]) for n in HEAD), (t, k)


@pytest.mark.parametrize("name", ["fedrep", "fedbabu"])
def test_its_own_sgd_refuses_adamw_in_one_line(tmp_path, capsys, name):
    one_line_refusal(capsys, ["run", "data.name=digits", "model.name=mlp", f"algorithm.name={name}", "train.rounds=1",
                              "train.optimizer=adamw", f"output.dir={tmp_path / 'run'}", "output.progress=false"],
                     "train.optimizer", "allowed: sgd")
    assert not (tmp_path / "run").exists()


def test_an_optimizer_start_needs_the_algorithms_own_optimiser():
    """optimizer_start prepares the state of the algorithm's optimiser; without one (the train
    section's) there is no state of a known form to prepare."""
    from fedrift.algorithms.base import Algorithm

    with pytest.raises(ValueError, match="optimizer_start .* give optimizer too"):
        Algorithm(name="x", hparams=None, local_loss=lambda *a: None, optimizer_start=lambda state, ctx: state)
