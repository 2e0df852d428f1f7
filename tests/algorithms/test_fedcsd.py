import math

import pytest
import torch
import torch.nn.functional as F
from agreement import BITS, agree, untimed

import fedrift
from fedrift.algorithms import ALGORITHMS, make
from fedrift.algorithms.base import ClientData, Setup
from fedrift.config import validate_options
from fedrift.engine.local import make_apply
from fedrift.functional.tree import stack
from fedrift.errors import ConfigError
from fedrift.models import MODELS, build_model

SETUP = Setup(num_classes=3, num_clients=2, feature_dim=4, lr=0.1, momentum=0.0, weight_decay=0.0, clip_grad_norm=None, seed=0)
e = math.e


def _alg(**hp):
    return make("fedcsd", SETUP, **hp)


def _identity(params, x, mode="logits"):
    return x  # "teacher logits" given directly as the data


def _stored(params, x, mode="logits"):
    return params["z"]  # a "model" whose logits are its only parameter


# ---------------------------------------------------------------------------------------
# The pre-phase: prototypes and their server average, by hand (C = 3)


def test_prototypes_by_hand_and_server_mean_over_holders_only():
    alg = _alg()
    payload = {"params": {}, "teacher": {}}
    # client A: two samples of class 0, one of class 1, none of class 2
    xa, xb = torch.tensor([[2.0, 0, 0], [4, 0, 0], [0, 2, 1]]), torch.tensor([[1.0, 2, 0]])
    # the engine hands client_summary the teacher's outputs on the client's samples
    a = ClientData(xa, torch.tensor([0, 0, 1]), alg.teacher(payload, xa, _identity))
    # client B: one sample of class 0 only
    b = ClientData(xb, torch.tensor([0]), alg.teacher(payload, xb, _identity))
    sa = alg.client_summary(payload, {}, a, _identity)
    sb = alg.client_summary(payload, {}, b, _identity)
    assert torch.equal(sa["prototypes"], torch.tensor([[3.0, 0, 0], [0, 2, 1], [0, 0, 0]]))
    assert torch.equal(sa["holds"], torch.tensor([True, True, False]))
    assert torch.equal(sb["prototypes"], torch.tensor([[1.0, 2, 0], [0, 0, 0], [0, 0, 0]]))
    assert torch.equal(sb["holds"], torch.tensor([True, False, False]))
    # class 0: mean of A's and B's rows; class 1: A's row alone; class 2: held by no one, zero.
    # A plain mean over holders: the sample weights (A has 3x B's samples) play no part.
    out = alg.pre_combine(payload, stack([sa, sb]), torch.tensor([0.75, 0.25]))
    assert set(out) == {"prototypes"}
    assert torch.equal(out["prototypes"], torch.tensor([[2.0, 1, 0], [0, 2, 1], [0, 0, 0]]))


# ---------------------------------------------------------------------------------------
# The local loss, by hand (C = 3, tau = 2, three samples of weight 1/3)

P_G = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0]])  # class 2 held by no one
Z_K = torch.tensor([[3.0, 4, 0], [0, 0, 2], [0, -2, 0]])  # student logits
Z_XI = torch.tensor([[2.0, 0, 0], [1, 0, 0.5], [1, 0, 0.9]])  # teacher logits
Y = torch.tensor([0, 2, 2])
W = torch.full((3,), 1 / 3)
TAU = 2.0
# delta = cos(z_k, P_G[c]): [3/5, 4/5, 0], [0, 0, 0] (zero rows and orthogonal), [0, -1, 0]
Z1, Z3 = math.exp(0.6) + math.exp(0.8) + 1, 2 + math.exp(-1)
DELTA_HAT = torch.tensor([
    [math.exp(0.6) / Z1, math.exp(0.8) / Z1, 1 / Z1],
    [1 / 3, 1 / 3, 1 / 3],
    [1 / Z3, math.exp(-1) / Z3, 1 / Z3],
])
Z_HAT = torch.tensor([[2 * math.exp(0.6) / Z1, 0, 0], [1 / 3, 0, 0.5 / 3], [1 / Z3, 0, 0.9 / Z3]])
# teacher's probability of the true class: e^2/(e^2+2) = 0.787, e^.5/(e+1+e^.5) = 0.307, e^.9/(e+1+e^.9) = 0.398
# adaptive mask (> 1/3): 1, 0, 1; argmax mask (teacher predicts y): 1, 0, 0
MASKS = {"adaptive": [1.0, 0, 1], "argmax": [1.0, 0, 0], "off": [1.0, 1, 1]}


def _per_sample_csd(z_hat):
    """tau^2 sum_c -softmax(z_hat / tau)_c log softmax(z_k / tau)_c, per sample."""
    return TAU**2 * (-torch.softmax(z_hat / TAU, -1) * torch.log_softmax(Z_K / TAU, -1)).sum(-1)


def _row(v, i):
    return {k: t[i] for k, t in v.items()} if isinstance(v, dict) else v[i]


def _loss(alg, z=Z_K):
    batch = {"x": torch.zeros(3, 1), "y": Y, "w": W}
    payload = {"params": {}, "teacher": {"z": Z_XI}, "prototypes": P_G}
    batch["teacher"] = alg.teacher(payload, batch["x"], _stored)  # as the engine adds it
    return alg.local_loss({"z": z}, batch, payload, {}, _stored)


def test_hand_numbers_behind_the_loss():
    torch.testing.assert_close(torch.tensor([e**2 / (e**2 + 2), e**0.5 / (e + 1 + e**0.5), e**0.9 / (e + 1 + e**0.9)]),
                               torch.softmax(Z_XI, -1).gather(1, Y[:, None]).squeeze(1))
    delta = F.normalize(Z_K, dim=-1) @ F.normalize(P_G, dim=-1).T
    torch.testing.assert_close(delta, torch.tensor([[0.6, 0.8, 0], [0, 0, 0], [0, -1.0, 0]]))
    torch.testing.assert_close(torch.softmax(delta, -1), DELTA_HAT)
    torch.testing.assert_close(DELTA_HAT * Z_XI, Z_HAT)


@pytest.mark.agreement
@pytest.mark.parametrize("mask,filtered", [("adaptive", 1 / 3), ("argmax", 2 / 3), ("off", 0.0)])
def test_csd_loss_by_hand(mask, filtered):
    ce = F.cross_entropy(Z_K, Y)
    m = torch.tensor(MASKS[mask])
    l_csd = (m * _per_sample_csd(Z_HAT)).sum() / 3  # masked samples count as zero in the batch mean
    loss, aux = _loss(_alg(mu=0.5, tau=TAU, mask=mask))
    agree(loss, ce + 0.5 * l_csd)
    torch.testing.assert_close(aux["fedcsd_mask_filtered"], torch.tensor(filtered))
    # the released code's form: (1 - mu) CE + mu L_CSD
    loss, _ = _loss(_alg(mu=0.5, tau=TAU, mask=mask, loss_form="convex"))
    agree(loss, 0.5 * ce + 0.5 * l_csd)
    # no similarity refinement: the teacher's own logits are the target
    l_plain = (m * _per_sample_csd(Z_XI)).sum() / 3
    loss, _ = _loss(_alg(mu=0.5, tau=TAU, mask=mask, similarity="off"))
    agree(loss, ce + 0.5 * l_plain)


@pytest.mark.agreement
def test_gradient_treats_similarity_as_constant_unless_told_otherwise():
    mu = 0.5
    ce_grad = torch.func.grad(lambda z: F.cross_entropy(z, Y))(Z_K)
    g = torch.func.grad(lambda z: _loss(_alg(mu=mu, tau=TAU), z)[0])(Z_K)
    # d/dz_k of tau^2 sum -q_xi log softmax(z_k/tau) with q_xi constant: tau (softmax(z_k/tau) - q_xi)
    m = torch.tensor(MASKS["adaptive"])[:, None]
    expect = ce_grad + mu * TAU * (1 / 3) * m * (torch.softmax(Z_K / TAU, -1) - torch.softmax(Z_HAT / TAU, -1))
    agree(g, expect)
    # the released code lets the gradient flow through delta_hat: same value, other gradient
    released = _alg(mu=mu, tau=TAU, detach_similarity=False)
    agree(_loss(released)[0], _loss(_alg(mu=mu, tau=TAU))[0])
    g2 = torch.func.grad(lambda z: _loss(released, z)[0])(Z_K)
    assert not torch.allclose(g, g2)
    assert torch.isfinite(g2).all()  # the zero prototype row gives no NaN through the cosine


@pytest.mark.agreement
def test_local_loss_under_vmap_equals_one_client_at_a_time():
    model = build_model("logreg", None, (4,), 3, seed=0)
    apply = make_apply(model, {})
    g = torch.Generator().manual_seed(1)
    base = {k: v.detach() for k, v in model.named_parameters()}
    clients = [{k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(2)]
    x = torch.randn(2, 5, 4, generator=g)
    y = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 1, 0, 0]])
    w = torch.tensor([[0.2] * 5, [0.25, 0.0, 0.25, 0.25, 0.25]])  # client 2's 2nd sample is padding
    teacher = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in base.items()}
    payload = {"params": base, "teacher": teacher, "prototypes": P_G}
    for detach in (True, False):
        alg = _alg(mu=0.5, tau=TAU, detach_similarity=detach)

        def grad_fn(p, batch):
            return torch.func.grad(lambda q: alg.local_loss(q, batch, payload, {}, apply), has_aux=True)(p)

        batches = {"x": x, "y": y, "w": w, "teacher": {"logits": torch.stack([apply(teacher, xi) for xi in x])}}
        vg, vaux = torch.func.vmap(grad_fn)(stack(clients), batches)
        for i in range(2):
            gi, auxi = grad_fn(clients[i], {k: _row(v, i) for k, v in batches.items()})
            agree({k: vg[k][i] for k in gi}, gi, where=f"client {i}")
            agree(vaux["fedcsd_mask_filtered"][i], auxi["fedcsd_mask_filtered"], where=f"client {i}")
            # the filter rate: the weighted share of samples whose true class gets <= 1/C from
            # the teacher; the padding sample weighs 0
            p_true = torch.softmax(apply(teacher, x[i]), -1).gather(1, y[i][:, None]).squeeze(1)
            agree(auxi["fedcsd_mask_filtered"], (w[i] * (p_true <= 1 / 3)).sum(), where=f"client {i}")


# ---------------------------------------------------------------------------------------
# Through the engine (digits, MLP)


def _run(tiny, tmp_path, name, algorithm, rounds=3, **sections):
    cfg = tiny(algorithm=algorithm, output={"dir": str(tmp_path / name)}, train={"rounds": rounds}, **sections)
    return fedrift.run(cfg)


@pytest.mark.agreement
def test_teacher_is_the_temporal_moving_average_of_global_models(tiny, tmp_path):
    a = 0.7
    alg = {"name": "fedcsd", "a": a, "mu": 0.1}
    runs = [_run(tiny, tmp_path, f"r{r}", alg, rounds=r) for r in (1, 2, 3)]  # round r of each run is the same
    init = build_model("mlp", MODELS.get("mlp").params(hidden=[32]), (1, 8, 8), 10, seed=0)
    teacher = {k: v.detach() for k, v in init.named_parameters()}  # w_xi^0 = w_G^0
    for run in runs:
        teacher = {k: a * teacher[k] + (1 - a) * run.global_state[k] for k in teacher}
        agree(run.server_state["teacher"], teacher)
    # the ablation: the teacher is the round's global model itself, the same tensors
    last = _run(tiny, tmp_path, "last", {"name": "fedcsd", "teacher": "last_global"}, rounds=2)
    assert last.server_state["teacher"] is last.server_state["params"]


@pytest.mark.agreement
@pytest.mark.parametrize("loss_form", ["paper", "convex"])
def test_mu_zero_is_exactly_fedavg(tiny, tmp_path, loss_form):
    a = _run(tiny, tmp_path, "a", {"name": "fedavg"})
    b = _run(tiny, tmp_path, "b", {"name": "fedcsd", "mu": 0.0, "loss_form": loss_form})
    agree(a.global_state, b.global_state, BITS)
    c = _run(tiny, tmp_path, "c", {"name": "fedcsd", "mu": 0.5, "loss_form": loss_form})
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)


def test_mask_filter_rate_is_reported_per_round(tiny, tmp_path):
    rates = {}
    for mask in ("adaptive", "argmax", "off"):
        res = _run(tiny, tmp_path, mask, {"name": "fedcsd", "mask": mask}, rounds=2)
        rates[mask] = [row["fedcsd_mask_filtered"] for row in res.history]
        assert len(rates[mask]) == 2 and all(0.0 <= r <= 1.0 for r in rates[mask])
    assert rates["off"] == [0.0, 0.0]
    # round 1: same teacher (w_G^0), same batches; argmax keeps a subset of what adaptive keeps
    assert rates["argmax"][0] >= rates["adaptive"][0] > 0.0


def test_prephase_adds_a_class_by_class_matrix_up_and_down(tiny, tmp_path):
    base = _run(tiny, tmp_path, "avg", {"name": "fedavg"}, rounds=2)
    last = _run(tiny, tmp_path, "last", {"name": "fedcsd", "teacher": "last_global"}, rounds=2)
    tma = _run(tiny, tmp_path, "tma", {"name": "fedcsd"}, rounds=2)
    clients, C = 3, 10
    pbytes = sum(v.numel() * 4 for v in base.global_state.values())
    for r in range(2):
        b, l, t = base.history[r], last.history[r], tma.history[r]
        # down: P_G (C x C float32); up: P_k (C x C float32) + the classes held (C bools)
        assert l["bytes_down"] - b["bytes_down"] == clients * C * C * 4
        assert l["bytes_up"] - b["bytes_up"] == clients * (C * C * 4 + C)
        assert t["bytes_up"] == l["bytes_up"]
        # TMA teacher: in round 1 it is w_G^0 itself (sent once); later a second model goes down
        assert t["bytes_down"] - l["bytes_down"] == (0 if r == 0 else clients * pbytes)


# ---------------------------------------------------------------------------------------
# Options


def test_options_defaults_yaml_switches_and_refusals():
    entry = ALGORITHMS.get("fedcsd")
    hp = validate_options("algorithm", entry.params, {})
    assert (hp.mu, hp.tau, hp.a, hp.similarity, hp.mask, hp.teacher, hp.detach_similarity, hp.loss_form, hp.aggregation) == (
        0.001, 10.0, 0.9, "on", "adaptive", "tma", True, "paper", "samples")
    # YAML reads a bare off/on as a boolean
    hp = validate_options("algorithm", entry.params, {"similarity": False, "mask": False})
    assert (hp.similarity, hp.mask) == ("off", "off")
    with pytest.raises(ConfigError, match="algorithm.mu"):
        validate_options("algorithm", entry.params, {"loss_form": "convex", "mu": 2.0})
    with pytest.raises(ConfigError, match="algorithm.mask"):
        validate_options("algorithm", entry.params, {"mask": "hard"})
    with pytest.raises(ConfigError, match="algorithm.alpha: unknown key"):
        validate_options("algorithm", entry.params, {"alpha": 0.9})


# ---------------------------------------------------------------------------------------
# variant: released, the authors' code (IAMJackYan/FedCSD, commit 5612114, train_ours.py)
#
# TRANSCRIPTION of that file's arithmetic, in plain torch: get_teacher_prototype,
# cal_cosine_similarity, and the loss in train_epoch's inner loop, line for line. Changes,
# all marked "(test)": the .to(device) moves are dropped, the data loader is a list of
# (x, target) batches, and the prototype matrix takes the logits' dtype (the original's
# torch.zeros is float32 by default; the test runs in float64).


def released_get_teacher_prototype(c, dataloader, net_g):
    outputs = None
    targets = None
    for batch_idx, (x, target) in enumerate(dataloader):
        out_g = net_g(x)
        if batch_idx == 0:
            outputs = out_g
            targets = target
        else:
            outputs = torch.cat((outputs, out_g), dim=0)
            targets = torch.cat((targets, target), dim=0)
    Prototype = torch.zeros((c, c), dtype=outputs.dtype)  # (test) dtype

    for i in range(c):
        index = (targets == i)
        nums = sum(index)
        if nums.item() == 0:
            continue
        index = index.unsqueeze(1)
        index = index.expand_as(outputs)
        temp_prototype = outputs * index
        temp_prototype = torch.sum(temp_prototype, dim=0)
        temp_prototype /= nums
        Prototype[i] = temp_prototype

    return Prototype


def released_cal_cosine_similarity(v1, v2):
    _v1 = F.normalize(v1, dim=-1, p=2)
    _v2 = F.normalize(v2, dim=-1, p=2)
    inner = torch.matmul(_v1, _v2.transpose(1, 0))
    s = F.softmax(inner, dim=-1)
    return s


def released_batch_loss(net, g_mt, Prototype_t, x, target, T, mu):
    """One step of train_epoch's loop, up to loss.backward(); returns (loss, mask)."""
    target = target.long()
    out = net(x)
    out_g = g_mt(x)

    out_g = out_g.detach()

    s_v = released_cal_cosine_similarity(out, Prototype_t)

    out_g = out_g * s_v

    b, c = out.shape

    out_softmax = F.softmax(out_g, dim=1)
    out_real = torch.zeros(b)
    for i in range(b):
        out_real[i] = out_softmax[i, target[i]]

    mask = out_real > (1 / c)
    mask = mask.float()

    loss_ce = F.cross_entropy(out, target)
    loss_kd = torch.nn.KLDivLoss(reduction='none')(F.log_softmax(out / T, dim=1), F.softmax(out_g / T, dim=1)) * (T * T)
    loss_kd = torch.sum(loss_kd, dim=1)
    loss_kd *= mask
    loss_kd = loss_kd.mean()

    loss = (1 - mu) * loss_ce + mu * loss_kd
    return loss, mask

# end of the transcription
# ---------------------------------------------------------------------------------------

RC, RD = 5, 6  # classes, input features


def _linear_apply(module):
    def apply(params, x, mode="logits"):
        return torch.func.functional_call(module, params, (x,))
    return apply


def _released_case(seed=3):
    """A client of 13 samples of 5 classes, class 4 absent (a zero prototype row); linear
    student and teacher in float64; the first batch of 8 is the step's."""
    g = torch.Generator().manual_seed(seed)
    student, teacher = torch.nn.Linear(RD, RC).double(), torch.nn.Linear(RD, RC).double()
    with torch.no_grad():
        for m, scale in ((student, 1.0), (teacher, 2.0)):
            m.weight.copy_(scale * torch.randn(RC, RD, generator=g, dtype=torch.float64))
            m.bias.copy_(torch.randn(RC, generator=g, dtype=torch.float64))
    x = torch.randn(13, RD, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 1, 3, 3])
    return student, teacher, x, y


def _fedrift_released(student, teacher, x, y, batch=8, **hp):
    """fedrift's variant released, as the engine drives it: client_start on the client's data
    (teacher rows of all its samples), then local_loss on the step's batch."""
    alg = make("fedcsd", Setup(num_classes=RC, num_clients=1, feature_dim=RD, lr=0.1, momentum=0.0,
                                weight_decay=0.0, clip_grad_norm=None, seed=0), variant="released", **hp)
    apply = _linear_apply(student)
    params = {k: v.detach().clone() for k, v in student.named_parameters()}
    payload = {"params": params, "teacher": {k: v.detach().clone() for k, v in teacher.named_parameters()}}
    with torch.no_grad():
        ctx = alg.client_start(payload, {}, ClientData(x, y, alg.teacher(payload, x, apply)), apply)
    xb, yb = x[:batch], y[:batch]
    b = {"x": xb, "y": yb, "w": torch.full((batch,), 1.0 / batch, dtype=x.dtype), "teacher": alg.teacher(payload, xb, apply)}
    (grads, (loss, aux)) = torch.func.grad(
        lambda p: (lambda out: (out[0], out))(alg.local_loss(p, b, payload, ctx, apply)), has_aux=True)(params)
    return alg, ctx, loss, aux, grads


def _released_reference(student, teacher, x, y, batch=8, T=4.0, mu=0.5):
    """The transcription: prototypes from the whole client loader, the loss on its first batch."""
    loader = [(x[:batch], y[:batch]), (x[batch:], y[batch:])]
    for p in teacher.parameters():
        p.requires_grad_(False)  # set_requires_grad(g_mt, False)
    proto = released_get_teacher_prototype(RC, loader, teacher)
    student.zero_grad()
    loss, mask = released_batch_loss(student, teacher, proto, x[:batch], y[:batch], T, mu)
    loss.backward()
    return proto, loss.detach(), mask, {k: v.grad.clone() for k, v in student.named_parameters()}


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.agreement
def test_released_variant_equals_a_transcription_of_train_ours_loss_and_gradient():
    """float64, to float rounding, not promised bit for bit: fedrift writes the batch mean as
    a weighted sum (w = 1/B, which the batched executor needs for its padding rows) and the
    class means as a one-hot product; the released file divides a sum by B and sums masked
    rows. The same operations otherwise (kl_div, normalize, softmax), so any difference is
    rounding: here the gradients come out bit-equal and the loss within 2e-16."""
    student, teacher, x, y = _released_case()
    alg, ctx, loss, aux, grads = _fedrift_released(student, teacher, x, y)
    proto, ref_loss, mask, ref_grads = _released_reference(student, teacher, x, y)
    assert alg.client_summary is None and alg.pre_combine is None  # no pre-phase: own prototypes
    agree(ctx["prototypes"], proto)
    assert torch.equal(proto[4], torch.zeros(RC, dtype=torch.float64))  # nobody holds class 4 here
    assert 0 < mask.sum() < 8  # the mask keeps some samples and drops others
    agree(loss, ref_loss)
    agree(aux["fedcsd_mask_filtered"].item(), 1 - mask.mean().item())
    agree(grads, ref_grads)


def test_paper_variant_with_gradient_through_similarity_is_not_the_released_code():
    """detach_similarity: false on the paper variant, even with the client's own prototypes as
    P_G and the released loss_form, mu and tau, has another mask and another gradient: the
    KL form's teacher-entropy term moves through delta_hat too."""
    student, teacher, x, y = _released_case()
    proto, ref_loss, ref_mask, ref_grads = _released_reference(student, teacher, x, y)
    alg = make("fedcsd", Setup(num_classes=RC, num_clients=1, feature_dim=RD, lr=0.1, momentum=0.0,
                                weight_decay=0.0, clip_grad_norm=None, seed=0),
               mu=0.5, tau=4.0, loss_form="convex", detach_similarity=False)
    apply = _linear_apply(student)
    params = {k: v.detach().clone() for k, v in student.named_parameters()}
    payload = {"params": params, "teacher": {k: v.detach().clone() for k, v in teacher.named_parameters()},
               "prototypes": proto}
    b = {"x": x[:8], "y": y[:8], "w": torch.full((8,), 1 / 8, dtype=x.dtype), "teacher": alg.teacher(payload, x[:8], apply)}
    grads = torch.func.grad(lambda p: alg.local_loss(p, b, payload, {}, apply)[0])(params)
    assert max(_rel(grads[k], ref_grads[k]) for k in grads) > 1e-3


@pytest.mark.agreement
def test_released_mask_reads_the_refined_logits_a_milder_filter():
    """On random 100-class logits (teacher logits 3x a standard normal, prototypes the class
    means of the teacher's logits): the refined logits ``delta_hat * z_xi`` are ~z_xi / C,
    nearly flat, so about half the samples pass 1/C; the paper's mask on z_xi keeps ~10%."""
    from fedrift.algorithms.fedcsd import class_prototypes, csd_terms

    g = torch.Generator().manual_seed(0)
    C, B = 100, 4096
    z = torch.randn(B, C, generator=g)
    z_teacher = 3.0 * torch.randn(B, C, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    protos = class_prototypes(z_teacher, y, C)[0]
    _, paper = csd_terms(z, z_teacher, y, protos, 4.0)
    _, released = csd_terms(z, z_teacher, y, protos, 4.0, detach_similarity=False, released=True)
    assert 0.07 < paper.mean().item() < 0.14
    assert 0.45 < released.mean().item() < 0.55
    # by definition: the released mask is the paper's rule applied to z_hat
    delta_hat = torch.softmax(F.normalize(z, dim=-1) @ F.normalize(protos, dim=-1).T, -1)
    _, again = csd_terms(z, delta_hat * z_teacher, y, protos, 4.0, similarity=False)
    agree(released, again, BITS)


@pytest.mark.agreement
def test_released_loss_by_hand_uses_the_clients_own_prototypes():
    """The hand case above under variant released: the prototypes come from the round's
    context (client_start), the payload has none; KL form; mask on Z_HAT (here 1, 0, 1)."""
    alg = _alg(variant="released", tau=TAU)  # mu 0.5 and loss_form convex: the released defaults
    batch = {"x": torch.zeros(3, 1), "y": Y, "w": W}
    payload = {"params": {}, "teacher": {"z": Z_XI}}
    batch["teacher"] = alg.teacher(payload, batch["x"], _stored)
    loss, aux = alg.local_loss({"z": Z_K}, batch, payload, {"prototypes": P_G}, _stored)
    q_hat, log_qk = torch.softmax(Z_HAT / TAU, -1), torch.log_softmax(Z_K / TAU, -1)
    kl = TAU**2 * (q_hat * (torch.log(q_hat) - log_qk)).sum(-1)
    # softmax(Z_HAT)_y: e^.722 / (e^.722 + 2) = 0.507; e^(.5/3) / (e^(1/3) + 1 + e^(.5/3)) = 0.330 (< 1/3);
    # with Z3 = 2 + e^-1: e^(.9/Z3) / (e^(1/Z3) + 1 + e^(.9/Z3)) = 0.367
    m = torch.tensor([1.0, 0, 1])
    torch.testing.assert_close(torch.softmax(Z_HAT, -1).gather(1, Y[:, None]).squeeze(1),
                               torch.tensor([0.5072, 0.3303, 0.3667]), atol=1e-4, rtol=0)
    agree(loss, 0.5 * F.cross_entropy(Z_K, Y) + 0.5 * (m * kl).sum() / 3)
    torch.testing.assert_close(aux["fedcsd_mask_filtered"], torch.tensor(1 / 3))
    # argmax of Z_HAT: class 0 in every row (y = 0, 2, 2): keeps the first sample only
    argmax = _alg(variant="released", tau=TAU, mask="argmax")
    loss, aux = argmax.local_loss({"z": Z_K}, batch, payload, {"prototypes": P_G}, _stored)
    agree(loss, 0.5 * F.cross_entropy(Z_K, Y) + 0.5 * kl[0] / 3)
    torch.testing.assert_close(aux["fedcsd_mask_filtered"], torch.tensor(2 / 3))


def test_released_options_defaults_and_overrides():
    entry = ALGORITHMS.get("fedcsd")
    hp = validate_options("algorithm", entry.params, {"variant": "released"})
    assert (hp.variant, hp.mu, hp.tau, hp.loss_form, hp.detach_similarity, hp.a, hp.mask, hp.similarity, hp.teacher) == (
        "released", 0.5, 4.0, "convex", False, 0.9, "adaptive", "on", "tma")
    # a key given explicitly wins over the variant's default
    hp = validate_options("algorithm", entry.params, {"variant": "released", "mu": 0.0, "tau": 2.0, "loss_form": "paper"})
    assert (hp.mu, hp.tau, hp.loss_form, hp.detach_similarity) == (0.0, 2.0, "paper", False)
    hp = make("fedcsd", SETUP, variant="released", detach_similarity=True).hparams  # as Python builds it
    assert (hp.mu, hp.detach_similarity) == (0.5, True)
    # the paper's defaults are untouched
    assert validate_options("algorithm", entry.params, {"variant": "paper"}).mu == 0.001
    with pytest.raises(ConfigError, match="algorithm.mu"):
        validate_options("algorithm", entry.params, {"variant": "released", "mu": 1.5})
    with pytest.raises(ConfigError, match="algorithm.variant"):
        validate_options("algorithm", entry.params, {"variant": "authors"})
    # similarity off: no prototypes to compute, no client_start
    assert make("fedcsd", SETUP, variant="released", similarity="off").client_start is None


@pytest.mark.agreement
def test_released_mu_zero_is_exactly_fedavg(tiny, tmp_path):
    a = _run(tiny, tmp_path, "a", {"name": "fedavg"})
    b = _run(tiny, tmp_path, "b", {"name": "fedcsd", "variant": "released", "mu": 0.0})
    agree(a.global_state, b.global_state, BITS)
    c = _run(tiny, tmp_path, "c", {"name": "fedcsd", "variant": "released"})
    assert any(not torch.equal(a.global_state[k], c.global_state[k]) for k in a.global_state)


def test_released_exchanges_no_prototypes(tiny, tmp_path):
    """Own prototypes: up, FedAvg's bytes; down, FedAvg's plus the TMA teacher (from round 2),
    the paper variant's bytes less its C x C matrix each way and the C-bool held list."""
    base = _run(tiny, tmp_path, "avg", {"name": "fedavg"}, rounds=2)
    paper = _run(tiny, tmp_path, "paper", {"name": "fedcsd"}, rounds=2)
    rel = _run(tiny, tmp_path, "rel", {"name": "fedcsd", "variant": "released"}, rounds=2)
    clients, C = 3, 10
    pbytes = sum(v.numel() * 4 for v in base.global_state.values())
    for r in range(2):
        b, p, q = base.history[r], paper.history[r], rel.history[r]
        assert q["bytes_up"] == b["bytes_up"]
        assert q["bytes_down"] - b["bytes_down"] == (0 if r == 0 else clients * pbytes)
        assert p["bytes_up"] - q["bytes_up"] == clients * (C * C * 4 + C)
        assert p["bytes_down"] - q["bytes_down"] == clients * C * C * 4
        assert 0.0 <= q["fedcsd_mask_filtered"] <= 1.0


@pytest.mark.process
@pytest.mark.agreement
def test_released_under_every_executor(tiny, tmp_path):
    """processes: bit for bit with sequential (one thread); batched: to float rounding
    (vmap's kernels), as for every algorithm (tests/engine/test_batched.py); ray: in
    tests/engine/test_ray.py."""
    alg = {"name": "fedcsd", "variant": "released"}
    runs = {}
    for ex in ("sequential", "processes", "batched"):
        runs[ex] = _run(tiny, tmp_path, ex, alg, engine={"executor": ex, "threads": 1, "workers": 2})
    seq = runs["sequential"]
    agree(seq.global_state, runs["processes"].global_state, BITS)
    agree(seq.global_state, runs["batched"].global_state)
    agree(untimed(seq.history), untimed(runs["processes"].history), BITS)
    agree(untimed(seq.history), untimed(runs["batched"].history))
    for a, p, b in zip(seq.history, runs["processes"].history, runs["batched"].history, strict=True):
        assert a["bytes_up"] == p["bytes_up"] == b["bytes_up"]
    # the prototypes from teacher rows computed on the client's samples, not the round's table
    fresh = _run(tiny, tmp_path, "fresh", alg, engine={"teacher_cache": False})
    agree(fresh.global_state, seq.global_state)


def test_released_privacy_client_level_runs_sample_level_refused(tiny, tmp_path):
    """No pre-phase summary goes up, so client level can clip the uploaded model as FedAvg's;
    sample level cannot: each sample's distillation reads prototypes of all the client's data."""
    alg = {"name": "fedcsd", "variant": "released"}
    res = _run(tiny, tmp_path, "client", alg, rounds=1, privacy={"level": "client"})
    assert res.summary["epsilon"] > 0
    with pytest.raises(ConfigError, match="privacy.level: sample: .*prototypes"):
        _run(tiny, tmp_path, "sample", alg, rounds=1, privacy={"level": "sample"})
    with pytest.raises(ConfigError, match="pre-phase"):  # the paper variant's prototypes go up
        _run(tiny, tmp_path, "paper", {"name": "fedcsd"}, rounds=1, privacy={"level": "client"})
