"""CCVR (Luo, Chen, Hu, Zhang, Liang & Feng, NeurIPS 2021, "No Fear of Heterogeneity:
Classifier Calibration for Federated Learning with Non-IID Data", Sec. 4, Algorithm 1):
FedAvg, then the classifier retrained on virtual representations drawn from the clients'
per-class feature statistics.

Training is FedAvg's, bit for bit (the same hooks). Calibration (``Algorithm.calibration``,
run by the server at evaluation):

1. Each client ``k`` of the evaluation panel runs the global model's feature extractor
   ``f`` (``mode="features"``, the input of the last linear layer) over its training data and
   uploads, for each class ``c`` it holds, ``N_{c,k}``, the mean ``mu_{c,k}`` and the unbiased
   covariance ``Sigma_{c,k}`` (``1/(N_{c,k} - 1)``; zero for a single sample) of the features
   (Algorithm 1, client side). Nothing else leaves the client; the bytes are reported as
   ``calibration_bytes_up``: per class held, ``d + d^2`` floats of the features' dtype and two
   int64 (class id, count). With ``covariance: diagonal`` it sends the variances alone
   (``Sigma_{c,k}``'s diagonal): ``d + d`` floats and the two int64 a class.
2. The server combines them (eq. 3 and 4): ``N_c = sum_k N_{c,k}``,
   ``mu_c = sum_k (N_{c,k}/N_c) mu_{c,k}``,
   ``Sigma_c = sum_k (N_{c,k}-1)/(N_c-1) Sigma_{c,k} + sum_k N_{c,k}/(N_c-1) mu_{c,k} mu_{c,k}^T
   - N_c/(N_c-1) mu_c mu_c^T``, which is the covariance of all the class's features pooled.
   It is folded client by client in float64 as the sums ``N_c``, ``sum_k N_{c,k} mu_{c,k}`` and
   ``sum_k [(N_{c,k}-1) Sigma_{c,k} + N_{c,k} mu_{c,k} mu_{c,k}^T]`` (the same equation with
   its common terms gathered), so a round holds one client's statistics, not K.
3. It draws ``M`` virtual features per class from ``N(mu_c, Sigma_c)`` (``M_c = M`` for every
   class some client holds; a class nobody holds gets none) and retrains the classifier (the
   parameters under the model's ``head_prefixes``, ``fc``) on them with cross-entropy: SGD
   with momentum, ``epochs`` passes of shuffled batches of ``batch_size``, starting from the
   global model's classifier. Every other parameter is the global model's, the same tensors.

Decisions:

- When (``calibrate_at``): ``final``, the default, calibrates once, after the last round:
  the paper's post-hoc use (Algorithm 1 runs after federated training). ``every`` calibrates
  at every evaluated round, so the two models are reported side by side round by round (a
  calibration costs about an evaluation of the panel's training data and, on a large
  ``d``, ``d x d`` statistics: on issue 51's 105 FEMNIST writers and the FedAvg CNN, 5.1 GB
  and minutes each time). A list
  of rounds calibrates there (evaluating those rounds whatever ``eval.every`` says) and at
  the last: what ``fedrift select`` gives its rungs, so a trial's rungs compare calibrated
  scores. A calibrating row carries the calibrated model's ``calibrated_accuracy`` beside
  the global model's ``test_accuracy`` (also ``calibrated_loss``,
  ``calibrated_local_accuracy`` on the panel's local test splits beside ``local_accuracy``,
  ``calibrated_val_accuracy`` with a validation split, and ``calibration_bytes_up`` /
  ``_down``); another row has none of them, and no statistics were gathered for it. The
  old ``when`` option (``eval``/``final``) still reads as ``every``/``final``. The panel
  is ``eval.clients_sample``'s: every client up to that many (the paper's Algorithm 1 asks
  every client).
- Covariance (``covariance``): ``full``, the default, is the paper's (eq. 4, a ``d x d``
  matrix a class). ``diagonal`` keeps each class's variances alone (the full covariance's
  diagonal, pooled by eq. 4's diagonal) and draws ``mu_c + sqrt(var_c) * z``: ``d`` numbers
  a class instead of ``d^2`` (on the FedAvg CNN, ``d = 512``: 4 KB a class instead of 1 MB;
  issue 51's 105 FEMNIST writers hold 4,864 classes between them: 20.0 MB instead of 5.1 GB,
  and at that shape the statistics and their fold take 0.6 CPU seconds instead of 96, the
  draws 2 instead of 11) and no ``eigh``, at the cost of the features' correlations, which the virtual features
  then lack. ``auto`` is diagonal where ``d > 256`` (``AUTO_DIAGONAL_ABOVE``: where a full
  covariance a class passes 256 KB in float32), full up to it. The paper names no such
  variant; it departs from it.
- The calibrated classifier is never sent down: the next round trains from FedAvg's model,
  so the calibration at round t is what stopping there would give. The run's final model
  (``final_model.pt``, ``result.global_state``) is the calibrated one, the paper's output;
  its body is the global model's, so the global model is that file with ``fc`` replaced by
  ``result.server_state["params"]``'s.
- Sampling: ``Sigma_c = V diag(lambda) V^T`` (``eigh`` in float64), a draw is
  ``mu_c + S z`` with ``S = V diag(sqrt(max(lambda, 0))) V^T``, the symmetric square root of
  ``Sigma_c``, and ``z`` standard normal: a covariance that is singular (fewer samples than
  dimensions, ReLU features that are always 0) or has rounding negatives needs no jitter.
  A diagonal covariance's root is ``sqrt(max(var, 0))``, the same ``S`` for ``diag(var)``.
  ``z`` is keyed by (seed, ``CCVR_RNG``, round, 0, class), the batch order by (seed,
  ``CCVR_RNG``, round, 1, epoch): the same under every executor and after a resume.
- Executors agree: the calibration runs in the server's process from the global model alone
  (``engine/calibrate.py``), so equal trained models give equal calibrated models, bit for
  bit. Trained models that differ by float rounding (another executor's kernels, a CPU
  without AVX-512) by a relative ``eps`` give calibrated classifiers within about
  ``sqrt(eps)`` relative: ``S`` is a continuous function of ``Sigma_c``
  (``||A^(1/2) - B^(1/2)|| <= ||A - B||^(1/2)`` for positive semi-definite ``A, B``), and the
  retraining is a fixed number of SGD steps (``tests/engine/test_batched.py`` checks this
  bound). The factor ``V diag(sqrt(lambda))`` alone would draw from the same distribution but
  is not continuous: the eigenvectors of near-equal eigenvalues turn freely, and a 1e-7
  difference in the trained model became 1e-3 in the classifier.
- Defaults: ``M = 2000`` virtual features per class, 10 epochs, lr 0.001, momentum 0.9,
  batch 64, no weight decay: the calibration settings of the public implementation
  smduan/Fed-CCVR (``conf.py``'s ``retrain``: ``num_vr``, ``epoch``, ``lr``; its SGD uses the
  run's momentum and batch size), the paper's Algorithm 1 leaving them as inputs. ``M = 0``
  skips the retraining: the calibrated model is the global model.
- Cost per calibration: one forward pass of the panel's training data (as much as an
  evaluation of the training set), an ``eigh`` of a ``d x d`` matrix per class (none when
  diagonal) and
  ``epochs * C M / batch_size`` SGD steps of the last layer alone. The uploads are not added
  to ``bytes_up`` (training's communication, FedAvg's): ``calibration_bytes_up`` and
  ``calibration_bytes_down`` (the global model sent to the panel) are reported beside them.
- Refused with a privacy level (the statistics are outside what it accounts for) and in a
  Flower deployment (the statistics would need one more exchange with every device after
  the round).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BeforeValidator, Field, PositiveInt

from fedrift.algorithms import ALGORITHMS
from fedrift.algorithms.base import Algorithm, AlgorithmParams, Apply, Calibration, Params, Setup, Tree
from fedrift.algorithms.fedavg import ce_loss
from fedrift.functional.rng import generator
from fedrift.params import params

CCVR_RNG = 103  # purpose tag of CCVR's server-side draws (virtual features, batch order)
AUTO_DIAGONAL_ABOVE = 256  # covariance: auto keeps full covariances up to this feature dimension
OLD_WHEN = {"eval": "every", "final": "final"}  # the option's old name's values, as calibrate_at's


def calibrate_at_value(v: object) -> object:
    """``final``, ``every``, or rounds (a list, or ``3,6,12`` as a command line gives it), each
    at least 1; anything else refused in one line that says what is allowed."""
    given = v
    if isinstance(v, str) and v not in ("final", "every"):
        try:
            v = [int(p) for p in v.split(",")]
        except ValueError:
            v = None
    ok = v in ("final", "every") or (isinstance(v, (list, tuple)) and len(v) > 0
                                     and all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in v))
    if not ok:
        raise ValueError(f"not a calibration schedule (got {given!r}); allowed: final, every, or a list of rounds "
                         ">= 1 (e.g. [3, 6, 12])")
    return v


@params
class CCVRParams(AlgorithmParams):
    """CCVR's options (Luo et al. 2021, Algorithm 1).

    M: virtual features drawn per class (``M_c``; 2000). 0: no retraining, the calibrated
        model is the global one.
    epochs: passes over the virtual features (10).
    lr: the calibration's SGD learning rate (0.001).
    momentum: its SGD momentum (0.9).
    batch_size: virtual features per SGD step (64).
    calibrate_at: ``final`` (the default): once, after the last round, as the paper does;
        ``every``: at every evaluated round (each row then carries the calibrated model's
        metrics); a list of rounds (``[3, 6, 12]``, what ``fedrift select`` gives its rungs):
        there, evaluated whatever ``eval.every`` says, and at the last round. A round that
        does not calibrate gathers no statistics: no bytes, no time, no ``calibrated_*`` keys.
    covariance: the class statistics' second moment: ``full`` (the paper's: a ``d x d``
        covariance a class), ``diagonal`` (the variances alone: ``d`` numbers a class, drawn
        as a diagonal Gaussian), ``auto``: diagonal where the feature dimension ``d`` is over
        256 (``AUTO_DIAGONAL_ABOVE``), full up to it.
    when: the old name of ``calibrate_at``, kept for configs written with it: ``eval`` is
        ``every``, ``final`` is ``final``; null (the default): ``calibrate_at`` decides.
    """

    M: Annotated[int, Field(ge=0)] = 2000
    epochs: PositiveInt = 10
    lr: Annotated[float, Field(gt=0)] = 0.001
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    batch_size: PositiveInt = 64
    calibrate_at: Annotated[Literal["final", "every"] | tuple[PositiveInt, ...], BeforeValidator(calibrate_at_value)] = "final"
    covariance: Literal["full", "diagonal", "auto"] = "full"
    when: Literal["eval", "final"] | None = None

    def __post_init__(self) -> None:
        if self.when is not None and self.calibrate_at not in ("final", OLD_WHEN[self.when]):
            raise ValueError(f"calibrate_at {self.calibrate_at!r} and its old name when {self.when!r} disagree; "
                             "allowed: calibrate_at alone")

    def rounds(self) -> tuple[int, ...] | None:
        """``Calibration.at``: None at every evaluated round, ``()`` at the last only, else the
        rounds listed (and the last)."""
        at = OLD_WHEN[self.when] if self.when is not None and self.calibrate_at == "final" else self.calibrate_at
        return None if at == "every" else () if at == "final" else tuple(sorted(set(at)))

    def diagonal(self, d: int) -> bool:
        """Whether features of dimension ``d`` are summarised by their variances alone."""
        return self.covariance == "diagonal" or (self.covariance == "auto" and d > AUTO_DIAGONAL_ABOVE)


# ---------------------------------------------------------------------------------------
# Client side: per-class feature statistics


def class_stats(h: torch.Tensor, y: torch.Tensor, diagonal: bool = False) -> Tree:
    """What a client uploads, for each class it holds (ascending): ``classes``, ``count``
    ``N_{c,k}``, ``mean`` and the unbiased ``cov`` of its features (zero for one sample), or
    with ``diagonal`` their unbiased variances ``var`` alone (the covariance's diagonal),
    computed in float64 and sent in the features' dtype."""
    classes = torch.unique(y)
    h64 = h.double()
    d = h.shape[1]
    counts, means, seconds = [], [], []
    for c in classes.tolist():
        hc = h64[y == c]
        n = len(hc)
        mean = hc.mean(0)
        centred = hc - mean
        if diagonal:
            second = (centred * centred).sum(0) / (n - 1) if n > 1 else h64.new_zeros(d)
        else:
            second = centred.T @ centred / (n - 1) if n > 1 else h64.new_zeros(d, d)
        counts.append(n)
        means.append(mean)
        seconds.append(second)
    key, empty = ("var", (0, d)) if diagonal else ("cov", (0, d, d))
    return {
        "classes": classes.to(torch.int64),
        "count": torch.tensor(counts, dtype=torch.int64, device=h.device),
        "mean": torch.stack(means).to(h.dtype) if means else h.new_zeros(0, d),
        key: torch.stack(seconds).to(h.dtype) if seconds else h.new_zeros(*empty),
    }


# ---------------------------------------------------------------------------------------
# Server side: eq. 3-4 as a running fold, sampling, retraining


def merge(acc: Tree | None, stats: Tree, num_classes: int) -> Tree:
    """Fold one client's statistics into the running sums (float64): ``n`` = ``sum_k N_{c,k}``,
    ``s1`` = ``sum_k N_{c,k} mu_{c,k}``, ``s2`` = ``sum_k [(N_{c,k}-1) Sigma_{c,k} + N_{c,k}
    mu_{c,k} mu_{c,k}^T]`` per class; from variances (``var``), the same sums' diagonals
    (``(N_{c,k}-1) var_{c,k} + N_{c,k} mu_{c,k}^2``, ``d`` numbers a class)."""
    mean = stats["mean"].double()
    diagonal = "var" in stats
    second = stats["var" if diagonal else "cov"].double()
    d = mean.shape[1]
    if acc is None:
        z = mean.new_zeros
        acc = {"n": z(num_classes), "s1": z(num_classes, d), "s2": z(num_classes, d) if diagonal else z(num_classes, d, d)}
    n = stats["count"].to(mean)
    cls = stats["classes"].to(mean.device)
    if diagonal:
        s2 = (n - 1)[:, None] * second + n[:, None] * mean * mean
    else:
        s2 = (n - 1)[:, None, None] * second + n[:, None, None] * (mean.unsqueeze(2) * mean.unsqueeze(1))  # mu mu^T
    return {
        "n": acc["n"].index_add(0, cls, n),
        "s1": acc["s1"].index_add(0, cls, n[:, None] * mean),
        "s2": acc["s2"].index_add(0, cls, s2),
    }


def global_stats(acc: Tree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N_c, mu_c, Sigma_c)`` per class from the folded sums (eq. 3-4); ``Sigma_c`` is
    ``(classes, d)`` variances where the sums are diagonal. A class with no sample has a
    zero mean, one with a single sample a zero covariance."""
    n, s1, s2 = acc["n"], acc["s1"], acc["s2"]
    held = n > 0
    mu = torch.where(held[:, None], s1 / n.clamp_min(1)[:, None], torch.zeros_like(s1))
    if s2.dim() == 2:  # diagonal: the variances
        scatter, rows = s2 - n[:, None] * mu * mu, (slice(None), None)
    else:
        scatter, rows = s2 - n[:, None, None] * (mu.unsqueeze(2) * mu.unsqueeze(1)), (slice(None), None, None)
    sigma = torch.where((n > 1)[rows], scatter / (n - 1).clamp_min(1)[rows], torch.zeros_like(s2))
    return n, mu, sigma


def virtual_features(mu: torch.Tensor, sigma: torch.Tensor, m: int, rng: np.random.Generator) -> torch.Tensor:
    """``m`` draws from ``N(mu, sigma)`` (float64): ``mu + S z`` with ``S = V diag(sqrt(max(lambda,
    0))) V^T`` the symmetric square root of ``sigma = V diag(lambda) V^T`` (continuous in
    ``sigma``, unlike ``V diag(sqrt(lambda))``) and ``z`` standard normal from ``rng``. A
    ``sigma`` of ``d`` variances (``covariance: diagonal``) is ``diag(sigma)``: its root is
    ``sqrt(max(sigma, 0))`` (rounding negatives at 0), the same ``z``."""
    if sigma.dim() == 1:
        root_diag = sigma.double().clamp_min(0).sqrt()
        z = torch.from_numpy(rng.standard_normal((m, len(mu)))).to(root_diag.device)
        return mu.double() + z * root_diag
    sigma = sigma.double()
    sigma = (sigma + sigma.T) / 2  # symmetric to the last bit, as eigh assumes
    scale = float(sigma.abs().max())  # decomposed at unit scale: eigh fails on huge finite entries
    if scale == 0.0:
        root = torch.zeros_like(sigma)
    else:
        try:
            lam, vec = torch.linalg.eigh(sigma / scale)
        except torch.linalg.LinAlgError as err:
            raise FloatingPointError(f"a class covariance cannot be decomposed (CCVR's calibration: {err})") from None
        # eigenvalues within rounding of 0 are 0 (numpy's matrix_rank's bound): a singular sigma's
        # roundoff eigenvalues (1e-16, positive on one CPU's kernels, negative on another's)
        # would put its draws 1e-8-1e-7 off its support, by sqrt
        lam = torch.where(lam > lam.max().clamp_min(0) * len(lam) * torch.finfo(lam.dtype).eps, lam, 0.0)
        root = (vec * (lam * scale).sqrt()) @ vec.T  # V diag(sqrt lambda) V^T: symmetric
    z = torch.from_numpy(rng.standard_normal((m, len(mu)))).to(root.device)
    return mu.double() + z @ root.T


def virtual_set(acc: Tree, m: int, seed: int, round_: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``M`` virtual features of each class some client holds, class by class, and their labels."""
    n, mu, sigma = global_stats(acc)
    if not (torch.isfinite(mu).all() and torch.isfinite(sigma).all()):  # eigh cannot take them: the model diverged
        raise FloatingPointError("the clients' class feature statistics are not finite (CCVR's calibration)")
    feats, labels = [], []
    for c in torch.nonzero(n > 0).flatten().tolist():
        feats.append(virtual_features(mu[c], sigma[c], m, generator(seed, CCVR_RNG, round_, 0, c)))
        labels.append(torch.full((m,), c, dtype=torch.int64, device=mu.device))
    return torch.cat(feats), torch.cat(labels)


def retrain_head(apply: Apply, params_: Params, head: set[str], x: torch.Tensor, y: torch.Tensor,
                 hp: CCVRParams, seed: int, round_: int) -> Params:
    """The classifier (``head``'s parameters) trained on ``(x, y)`` with cross-entropy and SGD
    with momentum (``buf = momentum buf + g``, ``w -= lr buf``, as ``torch.optim.SGD``), from
    the global model's; every other parameter is ``params_``'s own tensor."""
    fixed = {k: v for k, v in params_.items() if k not in head}
    tuned = {k: params_[k].detach().clone().requires_grad_(True) for k in params_ if k in head}
    bufs = {k: torch.zeros_like(v) for k, v in tuned.items()}
    x = x.to(next(iter(tuned.values())).dtype)
    with torch.enable_grad():
        for e in range(hp.epochs):
            order = torch.from_numpy(generator(seed, CCVR_RNG, round_, 1, e).permutation(len(y))).to(y.device)
            for i in range(0, len(y), hp.batch_size):
                idx = order[i : i + hp.batch_size]
                loss = F.cross_entropy(apply({**fixed, **tuned}, x[idx], mode="head"), y[idx])
                grads = torch.autograd.grad(loss, list(tuned.values()))
                with torch.no_grad():
                    for (k, w), g in zip(tuned.items(), grads):
                        bufs[k].mul_(hp.momentum).add_(g)
                        w.sub_(hp.lr * bufs[k])
    return {k: tuned[k].detach() if k in tuned else v for k, v in params_.items()}


# ---------------------------------------------------------------------------------------
# The algorithm


@ALGORITHMS.register(
    "ccvr",
    "CCVR: FedAvg, then the classifier retrained on virtual features from the clients' class means and covariances",
    CCVRParams,
    space={"M": "int:100:2000", "lr": "log:1e-4:1e-1"},
)
def ccvr(hp: CCVRParams, setup: Setup) -> Algorithm:
    num_classes, seed = setup.num_classes, setup.seed

    def calibrate(params_: Params, acc: Tree, round_: int, apply: Apply, head: set[str]) -> Params:
        if hp.M == 0:
            return params_
        x, y = virtual_set(acc, hp.M, seed, round_)
        return retrain_head(apply, params_, head, x, y, hp, seed, round_)

    diagonal = hp.diagonal(setup.feature_dim)
    calibration = Calibration(stats=lambda h, y: class_stats(h, y, diagonal), merge=lambda acc, s: merge(acc, s, num_classes),
                              calibrate=calibrate, at=hp.rounds())
    return Algorithm(name="ccvr", hparams=hp, local_loss=ce_loss, calibration=calibration)
