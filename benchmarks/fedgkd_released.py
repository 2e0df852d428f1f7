"""FedGKD's released code (CGCL-codes/FedGKD) against fedrift's ``fedgkd`` (issue 69 item 5).

The released code is read from a checkout (``--released``, default ``.peers/FedGKD``, a git-ignored
folder holding a snapshot of the public repository): its modules are imported from there at run
time, and none of its code is copied here. What this script adds around it is plumbing only:

- stand-in modules for what the compared code imports but never calls here: ``pcode.models``
  (its ``__init__`` imports ``transformers``), ``pcode.datasets.prepare_data`` (``torchvision``),
  ``six`` when it is not installed (``six.moves.cPickle`` is ``pickle``), and the packages
  ``pcode.workers`` / ``pcode.masters`` without their ``__init__``, which imports
  ``worker_scaffold`` / ``master_scaffold``, modules the repository does not hold;
- ``create_model.define_model`` returns fedrift's model (at fedrift's seeded initial weights)
  behind the released models' interface (``forward`` returns ``(features, logits)``);
  ``create_dataset.define_dataset`` / ``define_data_loader`` hand each client its fedrift split
  as one full batch (one step an epoch, so both sides see the same batches in the same order);
  ``master_utils.do_validation`` (test-set evaluation) records the round's global model instead;
- ``torch.distributed`` becomes an in-process stand-in: one thread per rank (the server is rank
  0, the ``n_participated`` workers ranks 1..K, as ``run_gloo.py`` spawns them), queues for
  ``send``/``recv``/``irecv``, a real barrier; ``broadcast`` copies the root's values into the
  front of the receiver's tensor, which is what gloo does in torch 2.13 when the sizes differ
  (the FedGKD worker listens for 4 rows, the server sends 3: see the findings); CUDA is off
  (``--on_cuda False``; ``run_gloo.init_cuda`` is not called).

The released server and workers then run their own loops, ``Master.run`` and ``Worker.run``
(``MasterFedGKD`` / ``WorkerFedGKD``), with the configuration their ``parameters.get_args``
parses from the README's FedGKD command (``--distillation_coefficient 0.1 --buffer_length 5
--avg_param True``, SGD lr 0.05, momentum 0.9, weight decay 1e-5, MultiStepLR), less the
options that parser refuses (``--mathod fedgkd``, a typo, and ``--fl_aggregate``), and with this
case's values appended (argparse keeps the last): digits' sizes in place of CIFAR-10's, M = 3,
T = 2, full batches, 5 local epochs, no CUDA. Checks:

(a) the local objective and its gradient on a fixed case (fedrift's MLP, a batch of digits,
    a buffer of M fixed global models): the released worker's ``_inference`` +
    ``local_training_with_extra_calculate`` after its server's ``ensemble_historical_models``
    and ``send_extra_info_to_selected_clients`` / ``recv_extra_info_from_master``, against
    ``fedrift.algorithms.make("fedgkd", ...)``'s ``broadcast``, ``teacher`` and ``local_loss``;
(b) rounds: 4 clients of sklearn's digits, every client every round, the same hyper-parameters;
    each round's global model of the released run against fedrift's (``fedrift.run``);
(c) what cannot run or departs: FedGKD-Vote's worker, the buffer of length 1, the weights of
    the aggregation.

The checkout, from a bare clone or snapshot ``$D`` of the repository (``.peer-commit`` names
its commit, which a ``git archive`` checkout does not keep):

    mkdir -p .peers/FedGKD && git --git-dir=$D archive HEAD | tar -x -C .peers/FedGKD
    git --git-dir=$D rev-parse HEAD > .peers/FedGKD/.peer-commit
    .venv/bin/python benchmarks/fedgkd_released.py --released .peers/FedGKD --json /tmp/fedgkd.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import json
import pickle
import queue
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedrift
from fedrift.algorithms import make
from fedrift.algorithms.base import RoundInfo, Setup
from fedrift.algorithms.fedgkd import average_params, vote_coefficients
from fedrift.engine.build import build_run, prepare
from fedrift.engine.local import make_apply

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-4  # tests/agreement.py's ROUNDING: the same sums in other orders (the agreement page's rule)
CLIENTS = 4
FULL_BATCH = 100_000  # larger than any client's split: one step an epoch, on all of it
TIMEOUT = 120.0  # seconds any rank waits for another (a hang in the released code fails instead)



# ---------------------------------------------------------------------------------------------
# The released code, imported from the checkout


def where(rel: Path, relpath: str, text: str) -> str:
    """``relpath:line`` of the first line of the checkout's file that contains ``text``."""
    for i, line in enumerate((rel / relpath).read_text().splitlines(), start=1):
        if text in line:
            return f"{relpath}:{i}"
    return f"{relpath}:? ({text!r} not found)"


class Released:
    """The released modules, imported from the checkout with the stand-ins the module docstring lists."""

    def __init__(self, path: Path):
        if not (path / "pcode" / "workers" / "worker_fedgkd.py").is_file():
            raise SystemExit(f"--released {path}: no pcode/workers/worker_fedgkd.py there; check out the "
                             "repository CGCL-codes/FedGKD into it (git archive HEAD | tar -x -C PATH)")
        self.path = path
        self.commit = self._commit(path)
        self.stand_ins: list[str] = []
        sys.path.insert(0, str(path))
        self._stand_in("pcode.models", "its __init__ imports transformers (bert.py); no released model is built")
        self._stand_in("pcode.datasets.prepare_data", "imports torchvision; datasets come from fedrift",
                       get_dataset=_unused("get_dataset"))
        for pkg in ("workers", "masters"):
            self._stand_in(f"pcode.{pkg}", f"package without its __init__ (it imports {pkg[:-1]}_scaffold, absent "
                           "from the repository)", __path__=[str(path / "pcode" / pkg)])
        try:
            importlib.import_module("six")
        except ImportError:
            self._stand_in("six", "not installed; only six.moves.cPickle is imported (op_files.py)")
            self._stand_in("six.moves", "as above", cPickle=pickle)
        imp = importlib.import_module
        self.worker = imp("pcode.workers.worker")
        self.worker_fedgkd = imp("pcode.workers.worker_fedgkd")
        self.master = imp("pcode.masters.master")
        self.master_fedgkd = imp("pcode.masters.master_fedgkd")
        self.create_model = imp("pcode.create_model")
        self.create_dataset = imp("pcode.create_dataset")
        self.create_metrics = imp("pcode.create_metrics")
        self.master_utils = imp("pcode.master_utils")
        self.checkpoint = imp("pcode.utils.checkpoint")
        self.logging = imp("pcode.utils.logging")
        self.topology = imp("pcode.utils.topology")
        self.param_parser = imp("pcode.utils.param_parser")
        self.tensor_buffer = imp("pcode.utils.tensor_buffer")
        self.parameters = imp("parameters")

    @staticmethod
    def _commit(path: Path) -> str:
        """The snapshot's commit: ``PATH/.peer-commit`` (a ``git archive`` checkout has no
        ``.git``), else ``git rev-parse`` in a clone."""
        marker = path / ".peer-commit"
        if marker.is_file():
            return marker.read_text().strip()
        if not (path / ".git").exists():
            return "unknown (write the snapshot's sha to PATH/.peer-commit)"
        try:
            git = ["git", "-C", str(path), "rev-parse", "HEAD"]
            return subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown (write it to PATH/.peer-commit)"

    def _stand_in(self, name: str, why: str, **attrs: Any) -> None:
        module = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(module, k, v)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        self.stand_ins.append(f"{name}: {why}")

    def readme_args(self) -> tuple[list[str], list[str]]:
        """The README's FedGKD command's options, and those its own parser refuses (dropped)."""
        text = (self.path / "README.md").read_text()
        block = text[text.index("The setup of the FedGKD"):]
        block = block[block.index("```bash") + len("```bash"):]
        block = block[:block.index("```")].replace("\\\n", " ").replace("$(which python)", "python")
        tokens = shlex.split(block)
        tokens = tokens[next(i for i, t in enumerate(tokens) if t.endswith("run_gloo.py")) + 1:]
        refused: list[str] = []
        while True:
            err = io.StringIO()
            argv, sys.argv = sys.argv, ["run_gloo.py", *tokens]
            try:
                with contextlib.redirect_stderr(err):
                    self.parameters.get_args()
                return tokens, refused
            except SystemExit:
                found = re.search(r"unrecognized arguments: (.*)", err.getvalue())
                if not found:
                    raise
                for bad in found.group(1).split():
                    tokens.remove(bad)
                    refused.append(bad)
            finally:
                sys.argv = argv

    def set_dist(self, fake: "FakeDist") -> None:
        for m in (self.worker, self.worker_fedgkd, self.master, self.master_fedgkd):
            m.dist = fake

    def conf(self, args: list[str], rank: int, tmp: Path, n_participated: int):
        """The configuration ``run_gloo.py`` hands rank ``rank``: ``parameters.get_args`` on
        ``args``, then ``run_gloo``'s ``__main__`` and ``init_config`` without ``init_cuda``."""
        argv, sys.argv = sys.argv, ["run_gloo.py", *args]
        try:
            conf = self.parameters.get_args()
        finally:
            sys.argv = argv
        conf.n_participated = int(conf.n_clients * conf.participation_ratio + 0.5)
        assert conf.n_participated == n_participated
        conf.timestamp = "0"
        conf.graph = self.topology.define_graph_topology(
            world=conf.world, world_conf=conf.world_conf, n_participated=conf.n_participated, on_cuda=conf.on_cuda)
        conf.graph.rank = rank
        if not conf.same_seed_process:
            conf.manual_seed = 1000 * conf.manual_seed + conf.graph.rank
        conf.random_state = np.random.RandomState(conf.manual_seed)
        torch.manual_seed(conf.manual_seed)
        conf.arch_info = (self.param_parser.dict_parser(conf.complex_arch) if conf.complex_arch is not None
                          else {"master": conf.arch, "worker": conf.arch})
        conf.arch_info["worker"] = conf.arch_info["worker"].split(":")
        conf.checkpoint = str(tmp)
        conf.job_id = str(tmp / "jobrun_logs")
        self.checkpoint.init_checkpoint(conf, rank=str(conf.graph.rank))
        conf.logger = self.logging.Logger(conf.checkpoint_dir)
        return conf


def _unused(name: str):
    def fail(*a, **k):
        raise RuntimeError(f"{name}: a stand-in; this comparison never calls it")
    return fail


class ReleasedModel(torch.nn.Module):
    """fedrift's model behind the released models' interface: ``forward`` returns ``(features, logits)``."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return x.flatten(1), self.net(x)


def strip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``ReleasedModel`` state in fedrift's names (no ``net.``), detached copies."""
    return {k.removeprefix("net."): v.detach().clone() for k, v in state.items()}


class _Done:
    def __init__(self, fn):
        self.fn = fn

    def wait(self):
        self.fn()


class FakeDist:
    """``torch.distributed`` in one process: a thread per rank, a queue per (src, dst) pair."""

    def __init__(self, world: int, parties: int | None = None, timeout: float = TIMEOUT):
        self.local = threading.local()
        self.local.rank = 0
        self.world, self.timeout = world, timeout
        self._barrier = threading.Barrier(parties or world, timeout=timeout)  # parties=1: one thread plays every rank
        self.queues = {(s, d): queue.Queue() for s in range(world) for d in range(world) if s != d}
        self.casts = {r: queue.Queue() for r in range(world)}
        self.size_mismatches: list[str] = []

    @property
    def rank(self) -> int:
        return self.local.rank

    def get_rank(self) -> int:
        return self.rank

    def barrier(self):
        self._barrier.wait()

    def send(self, tensor, dst):
        self.queues[(self.rank, dst)].put(tensor.detach().clone())

    def recv(self, tensor, src):
        data = self.queues[(src, self.rank)].get(timeout=self.timeout)
        if data.numel() != tensor.numel():
            raise RuntimeError(f"recv on rank {self.rank}: {data.numel()} values sent, {tensor.numel()} expected")
        tensor.copy_(data.view_as(tensor))

    def irecv(self, tensor, src):
        return _Done(lambda: self.recv(tensor, src))

    def broadcast(self, tensor, src):
        if self.rank == src:
            for r in range(self.world):
                if r != src:
                    self.casts[r].put(tensor.detach().clone())
            return
        data = self.casts[self.rank].get(timeout=self.timeout)
        if data.shape != tensor.shape:
            self.size_mismatches.append(f"rank {src} broadcast {tuple(data.shape)}, rank {self.rank} received into "
                                        f"{tuple(tensor.shape)}")
        n = min(data.numel(), tensor.numel())
        tensor.view(-1)[:n] = data.reshape(-1)[:n]  # gloo (torch 2.13): the root's values, the rest untouched


# ---------------------------------------------------------------------------------------------
# The case: fedrift's data, partition and model


def fedrift_config(out: Path, rounds: int, M: int, gamma: float, T: float, epochs: int, lr: float, wd: float,
                   aggregation: str) -> dict[str, Any]:
    """fedrift's side: every client every round, full-batch local steps, no evaluation but the last."""
    return {
        "seed": 0,
        "data": {"name": "digits"},
        "partition": {"name": "dirichlet", "alpha": 0.5, "num_clients": CLIENTS, "min_size": 20},
        "model": {"name": "mlp", "hidden": [16]},
        "algorithm": {"name": "fedgkd", "M": M, "gamma": gamma, "T": T, "aggregation": aggregation},
        "train": {"rounds": rounds, "clients_per_round": CLIENTS, "local_epochs": epochs, "batch_size": FULL_BATCH,
                  "lr": lr, "momentum": 0.9, "weight_decay": wd, "clip_grad_norm": 10.0},
        "eval": {"every": 1000},
        "engine": {"executor": "sequential", "threads": 1},
        "output": {"dir": str(out), "progress": False, "save_model": False},
    }


class Case:
    """fedrift's start: the model at its seeded initial weights, each client's ``(x, y)``."""

    def __init__(self, cfg: dict[str, Any]):
        prep = prepare(cfg)
        model, _ = build_run(prep)
        ds, part = prep.dataset, prep.partition
        if ds.prepare is not None:
            raise SystemExit("this case needs a dataset whose rows are the model's input (digits)")
        self.model = model.eval()
        self.clients = [(ds.x_train[torch.as_tensor(part.train[k])], ds.y_train[torch.as_tensor(part.train[k])])
                        for k in range(part.num_clients)]
        self.num_classes = ds.num_classes
        self.initial = {k: v.detach().clone() for k, v in model.state_dict().items()}


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference over the largest magnitude (tests/peers/peer_work.py's figure)."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    num = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    den = max(max(float(a[k].double().abs().max()), float(b[k].double().abs().max())) for k in a)
    return num / max(den, 1e-300)


README_ARGS: list[str] = []  # the README's FedGKD command as its parser accepts it (main sets it)


def released_args(M: int, coef: float, T: float, kind: str, epochs: int, lr: float, wd: float, rounds: int,
                  avg_param: bool = True) -> list[str]:
    """The README's FedGKD command, then this case's values (argparse keeps the last)."""
    return [*README_ARGS, "--method", "fedgkd", "--pin_memory", "False", "--num_workers", "0", "--arch", "mlp",
            "--complex_arch", "master=mlp,worker=mlp", "--data", "digits",
            "--distillation_coefficient", repr(coef), "--buffer_length", str(M), "--temperature", repr(T),
            "--loss_type", kind, "--avg_param", str(avg_param), "--batch_size", str(FULL_BATCH),
            "--n_clients", str(CLIENTS), "--participation_ratio", "1", "--n_comm_rounds", str(rounds),
            "--local_n_epochs", str(epochs), "--lr", repr(lr), "--weight_decay", repr(wd), "--on_cuda", "False"]


class Harness:
    """The released server and workers on ``case``: stand-ins installed, a fake world per run."""

    def __init__(self, rel: Released, case: Case, tmp: Path):
        self.rel, self.case, self.tmp = rel, case, tmp
        self.globals: dict[int, dict[str, torch.Tensor]] = {}
        self.teachers: dict[tuple[int, int], dict[str, torch.Tensor]] = {}  # (round, client) -> teacher used
        rel.create_model.define_model = self.define_model
        rel.create_dataset.define_dataset = self.define_dataset
        rel.create_dataset.define_data_loader = self.define_data_loader
        rel.master_utils.do_validation = self.do_validation

    def define_model(self, conf, show_stat=True, to_consistent_model=True, use_complex_arch=True, client_id=None,
                     arch=None):
        arch = arch or self.rel.create_model.determine_arch(conf, client_id, use_complex_arch)
        return arch, ReleasedModel(copy.deepcopy(self.case.model))

    def define_dataset(self, conf, data, display_log=True, agg_data_ratio=0.0):
        conf.partitioned_by_user = False
        return {"train": self.case.clients, "val": None, "test": None, "agg": None}

    def define_data_loader(self, conf, dataset, localdata_id=None, is_train=True, shuffle=True,
                           data_partitioner=None):
        loader = [] if dataset is None or localdata_id is None else [tuple(t.clone() for t in dataset[localdata_id])]
        conf.num_batches_per_device_per_epoch = len(loader)
        conf.num_whole_batches_per_worker = len(loader) * conf.local_n_epochs
        return loader, "partition: fedrift's"

    def do_validation(self, conf, coordinator, model, criterion, metrics, data_loaders, label=None, **kw):
        if label == "aggregated_test_loader_0":  # right after the round's aggregation (master.py)
            self.globals[conf.graph.comm_round] = strip(model.state_dict())

    def recording_worker(self):
        harness, base = self, self.rel.worker_fedgkd.WorkerFedGKD

        class RecordingWorkerFedGKD(base):
            """``WorkerFedGKD`` that records the teacher it trains against (nothing else changes)."""

            def prepare_train(self):
                super().prepare_train()
                key = (self.conf.graph.comm_round, self.conf.graph.client_id)
                harness.teachers[key] = strip(self.avg_teacher.state_dict())

        return RecordingWorkerFedGKD

    def run(self, args: list[str]) -> dict[str, Any]:
        """The released ``MasterFedGKD.run`` and ``WorkerFedGKD.run``, one thread a rank."""
        world = CLIENTS + 1
        fake = FakeDist(world)
        self.rel.set_dist(fake)
        self.globals, self.teachers = {}, {}
        errors: list[str] = []
        worker_cls = self.recording_worker()

        def rank_main(rank: int):
            fake.local.rank = rank
            try:
                conf = confs[rank]
                process = self.rel.master_fedgkd.MasterFedGKD(conf) if rank == 0 else worker_cls(conf)
                process.run()
            except BaseException:  # noqa: BLE001 - reported, and the barrier released for the others
                errors.append(f"rank {rank}: {traceback.format_exc()}")
                fake._barrier.abort()

        confs = [self.rel.conf(args, rank, self.tmp / f"run{id(fake)}", CLIENTS) for rank in range(world)]
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT * 4)
        if errors:
            raise RuntimeError("the released run failed:\n" + "\n".join(errors))
        if any(t.is_alive() for t in threads):
            raise RuntimeError("the released run hung; its log:\n" + log.getvalue()[-4000:])
        return {"broadcast_size_mismatches": sorted(set(fake.size_mismatches))}


# ---------------------------------------------------------------------------------------------
# (a) the local objective and its gradient


def local_objective(rel: Released, case: Case, *, M: int, gamma: float, T: float, kind: str,
                    round_: int, tmp: Path) -> dict[str, Any]:
    """One loss and gradient by each side: student ``w``, buffer ``w_1..w_M`` (oldest first),
    a batch of 64 of client 0's samples."""
    g = torch.Generator().manual_seed(1)
    base = case.initial
    buffer = [{k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(M)]
    student = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in buffer[-1].items()}
    x, y = case.clients[0][0][:64], case.clients[0][1][:64]

    # released: the server buffers the models as its aggregate does, sends the averaged teacher,
    # the worker receives it and computes its loss on the batch
    fake = FakeDist(2, parties=1)
    rel.set_dist(fake)
    args = released_args(M, gamma / 2, T, kind, epochs=1, lr=0.05, wd=0.0, rounds=round_)
    tmp = tmp / f"a-{kind}-{T:g}-{M}-{round_}"
    mconf = rel.conf(args, 0, tmp, CLIENTS)
    with contextlib.redirect_stdout(io.StringIO()):
        master = rel.master_fedgkd.MasterFedGKD(mconf)
        for w in buffer:
            m = ReleasedModel(copy.deepcopy(case.model))
            m.net.load_state_dict(w)
            master.ensemble_historical_models(m)
        fake.local.rank = 1
        wconf = rel.conf(args, 1, tmp, CLIENTS)
        worker = rel.worker_fedgkd.WorkerFedGKD(wconf)
        worker.model = ReleasedModel(copy.deepcopy(case.model))
        worker.model_state_dict = worker.model.state_dict()
        worker.model_tb = rel.tensor_buffer.TensorBuffer(list(worker.model_state_dict.values()))
        fake.local.rank = 0
        master.send_extra_info_to_selected_clients([1])
        fake.local.rank = 1
        wconf.graph.client_id, wconf.graph.comm_round = 1, round_  # what listen_to_master reads from the server
        worker.recv_extra_info_from_master()
        worker.model.net.load_state_dict(student)
        worker.metrics = rel.create_metrics.Metrics(worker.model, task="classification")
        wconf.num_batches_per_device_per_epoch = 1
        worker.prepare_train()
        batch = rel.create_dataset.load_data_batch(wconf, x.clone(), y.clone(), is_training=True, device=worker.device)
        loss, _, feature, output = worker._inference(batch)
        loss = worker.local_training_with_extra_calculate(loss, output, batch, feature)
        worker.optimizer.zero_grad()
        loss.backward()
    r_loss = float(loss.detach())
    r_grad = {k.removeprefix("net."): p.grad.detach().clone() for k, p in worker.model.named_parameters()}
    r_teacher = strip(worker.avg_teacher.state_dict())

    # fedrift: the same buffer through init_server / aggregate_sums, the round's broadcast, the
    # teacher hook and local_loss
    setup = Setup(num_classes=case.num_classes, num_clients=CLIENTS, feature_dim=64, lr=0.05, momentum=0.9,
                  weight_decay=0.0, clip_grad_norm=10.0, seed=0)
    alg = make("fedgkd", setup, M=M, gamma=gamma, T=T, kd_loss=kind)
    sampled = tuple(range(CLIENTS))
    state = alg.init_server(base)
    for r, w in enumerate(buffer, start=1):
        state = alg.aggregate_sums(state, {"params": w}, RoundInfo(r, CLIENTS, sampled))
    if round_ == 1:
        state = alg.init_server(base)  # round 1: nothing buffered yet
    payload = alg.broadcast(state, RoundInfo(round_, CLIENTS, sampled))
    apply = make_apply(copy.deepcopy(case.model), {})
    fb = {"x": x, "y": y, "w": torch.full((len(y),), 1.0 / len(y))}
    fb["teacher"] = alg.teacher(payload, x, apply)
    params = {k: v.clone().requires_grad_(True) for k, v in student.items()}
    f_loss, _ = alg.local_loss(params, fb, payload, {}, apply)
    f_grad = dict(zip(params, torch.autograd.grad(f_loss, list(params.values()))))
    f_loss = float(f_loss.detach())
    row = {"check": f"local objective, {kind}, T={T:g}, M={M}, round {round_}", "released": r_loss,
           "fedrift": f_loss, "loss": abs(r_loss - f_loss) / abs(f_loss),
           "gradient": relative_difference(r_grad, f_grad)}
    if round_ > 1:
        row["teacher"] = relative_difference(r_teacher, {k: v.detach() for k, v in payload["teacher"].items()})
    return row


def vote_pieces(rel: Released, case: Case, *, M: int, lam: float, T: float, tmp: Path) -> dict[str, Any]:
    """FedGKD-Vote's worker cannot run (see findings): its KD term alone, called directly with
    the same buffer and losses, against fedrift's; and whether it has a gradient."""
    g = torch.Generator().manual_seed(2)
    buffer = [{k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in case.initial.items()} for _ in range(M)]
    student = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in buffer[-1].items()}
    x, y = case.clients[1][0][:64], case.clients[1][1][:64]
    apply = make_apply(copy.deepcopy(case.model), {})
    with torch.no_grad():
        losses = torch.stack([torch.nn.functional.cross_entropy(apply(w, x), y) for w in buffer])  # L_m, oldest first
    fake = FakeDist(2, parties=1)
    rel.set_dist(fake)
    fake.local.rank = 1
    args = released_args(M, lam, T, "kl", epochs=1, lr=0.05, wd=0.0, rounds=2, avg_param=False)
    wconf = rel.conf(args, 1, tmp / "v", CLIENTS)
    with contextlib.redirect_stdout(io.StringIO()):
        worker = rel.worker_fedgkd.WorkerFedGKD(wconf)
    out: dict[str, Any] = {"listen_to_master": []}
    # 1. listen_to_master as the Vote worker runs it (round 2, client 1): as parsed, then with
    # the missing option set to the paper's beta = 1/M
    worker.init_model = _frozen(case, buffer[0])
    for attempt in ("as parsed", "loss_temperature = 1/M"):
        if attempt != "as parsed":
            wconf.loss_temperature = 1.0 / M
        worker.models_buffer = []
        fake.casts[1].put(torch.tensor([[1.0], [2.0], [1.0], [float(losses[0])]]).expand(4, CLIENTS).clone())
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                worker.listen_to_master()
            out["listen_to_master"].append(f"{attempt}: ran")
        except Exception as e:  # noqa: BLE001 - what the released code raises is the finding
            tb = traceback.extract_tb(e.__traceback__)[-1]
            at = f"{Path(tb.filename).name}:{tb.lineno}"
            out["listen_to_master"].append(f"{attempt}: {type(e).__name__}: {e} at {at}")
    # 2. the weights softmax(-L / loss_temperature) and the KD term, called directly
    worker.models_buffer = [{"valid_loss": float(L), "model": _frozen(case, w)} for L, w in zip(losses, buffer)]
    worker.get_global_weights()
    # 3. the KD term, as the worker would add it (times distillation_coefficient = lam)
    sm = ReleasedModel(copy.deepcopy(case.model))
    sm.net.load_state_dict(student)
    _, z = sm(x)
    kd_released = wconf.distillation_coefficient * worker.distillation_with_multiple(z, x)
    setup = Setup(num_classes=case.num_classes, num_clients=CLIENTS, feature_dim=64, lr=0.05, momentum=0.9,
                  weight_decay=0.0, clip_grad_norm=10.0, seed=0)
    alg = make("fedgkd_vote", setup, M=M, lam=lam, T=T, vote_loss="client")
    newest_first = buffer[::-1]
    payload = {"params": buffer[-1], "teachers": {str(i): w for i, w in enumerate(newest_first)}, "kd_on": 1.0}
    coef = vote_coefficients(losses.flip(0), lam, 1.0 / M)
    params = {k: v.clone().requires_grad_(True) for k, v in student.items()}
    fb = {"x": x, "y": y, "w": torch.full((len(y),), 1.0 / len(y))}
    fb["teacher"] = alg.teacher(payload, x, apply)
    _, aux = alg.local_loss(params, fb, payload, {"vote_coef": coef}, apply)
    kd_fedrift = aux["fedgkd_kd"]
    grads = {"released": bool(kd_released.requires_grad), "fedrift": bool(kd_fedrift.requires_grad)}
    kd_released, kd_fedrift = float(kd_released.detach()), float(kd_fedrift.detach())
    out.update({
        "kd_released": kd_released, "kd_fedrift": kd_fedrift, "kd": abs(kd_released - kd_fedrift) / abs(kd_fedrift),
        "weights": relative_difference({"w": wconf.distillation_coefficient * worker.model_weights.flip(0)},
                                       {"w": coef}),
        "released_kd_requires_grad": grads["released"], "fedrift_kd_requires_grad": grads["fedrift"],
    })
    return out


def _frozen(case: Case, w: dict[str, torch.Tensor]) -> torch.nn.Module:
    m = ReleasedModel(copy.deepcopy(case.model))
    m.net.load_state_dict(w)
    return m.eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------
# (b) rounds


def fedrift_globals(cfg_of, rounds: int, M: int) -> dict[int, dict[str, torch.Tensor]]:
    """Every round's global model of a fedrift run: the buffer of runs of ``rounds`` and fewer
    rounds (the buffer holds the last ``M`` global models, most recent first)."""
    found: dict[int, dict[str, torch.Tensor]] = {}
    R = rounds
    while R >= 1:
        res = fedrift.run(cfg_of(R))
        buf = res.server_state.get("buffer", {})
        models = [buf[str(i)] for i in range(len(buf))] or [res.global_state]
        for i, m in enumerate(models):
            found.setdefault(R - i, {k: v.detach().clone() for k, v in m.items()})
        R -= len(models)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--released", type=Path, default=ROOT / ".peers" / "FedGKD",
                   help="a checkout of CGCL-codes/FedGKD (default .peers/FedGKD)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=5, help="local epochs (one full-batch step each)")
    args = p.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)  # a 16-unit MLP: one thread is the fastest, and the machine may be shared
    torch.manual_seed(0)
    rel = Released(args.released.resolve())
    readme, refused = rel.readme_args()
    README_ARGS[:] = readme
    M, gamma, T, lr, wd, R, E = 3, 0.2, 2.0, 0.05, 1e-5, args.rounds, args.epochs
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)

        def cfg_of(aggregation: str, m: int, tag: str):
            return lambda r: fedrift_config(tmp / f"{tag}-{r}", r, m, gamma, T, E, lr, wd, aggregation)

        case = Case(cfg_of("uniform", M, "case")(1))
        harness = Harness(rel, case, tmp)

        # (a)
        local = [local_objective(rel, case, M=M, gamma=gamma, T=t, kind=k, round_=r, tmp=tmp)
                 for (k, t, r) in (("kl", 1.0, M + 1), ("kl", 2.0, M + 1), ("mse", 2.0, M + 1), ("kl", 2.0, 1))]
        vote = vote_pieces(rel, case, M=M, lam=0.1, T=T, tmp=tmp)

        # (b) M = 3 (the buffer's eviction from round 5), fedrift with the released weights (uniform)
        info = harness.run(released_args(M, gamma / 2, T, "kl", E, lr, wd, R))
        released = dict(harness.globals)
        ours = fedrift_globals(cfg_of("uniform", M, "u"), R, M)
        def row(check: str, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
            rows.append({"check": check, "difference": relative_difference(a, b)})

        for r in range(1, R + 1):
            row(f"M={M}, aggregation uniform, round {r}", released[r], ours[r])
        for r in range(2, R + 1):  # the teacher each released worker trained against, against fedrift's w_bar
            w_bar = average_params([ours[s] for s in range(r - 1, max(0, r - 1 - M), -1)])
            diff = max(relative_difference(harness.teachers[(r, c)], w_bar) for c in range(1, CLIENTS + 1))
            rows.append({"check": f"M={M}, teacher of round {r}", "difference": diff})
        # ... and with fedrift's default, the paper's n_k / n weights
        paper = fedrift_globals(cfg_of("samples", M, "s"), 1, M)
        row(f"M={M}, aggregation samples (the paper), round 1", released[1], paper[1])

        # (c) M = 1: the teacher the released workers train against
        harness.run(released_args(1, gamma / 2, T, "kl", E, lr, wd, 3))
        released1, teachers1 = dict(harness.globals), dict(harness.teachers)
        ours1 = fedrift_globals(cfg_of("uniform", 1, "m1"), 3, 1)
        for r in (1, 2, 3):
            row(f"M=1, aggregation uniform, round {r}", released1[r], ours1[r])
        w0, clients = case.initial, range(1, CLIENTS + 1)
        m1_teacher = {r: {"is_w0": all(torch.equal(teachers1[(r, c)][k], w0[k]) for c in clients for k in w0),
                          "vs_w_prev": relative_difference(teachers1[(r, 1)], released1[r - 1])} for r in (2, 3)}

    sizes = [len(y) for _, y in case.clients]
    wk, ms = "pcode/workers/worker_fedgkd.py", "pcode/masters/master_fedgkd.py"
    lines = {
        "kd": where(rel.path, wk, "def _divergence"),
        "kd_batchmean": where(rel.path, wk, 'reduction="batchmean"'),
        "coefficient": where(rel.path, wk, "loss2 = self.conf.distillation_coefficient * loss2"),
        "round1": where(rel.path, wk, "comm_round <= 1"),
        "teacher_avg": where(rel.path, ms, "def ensemble_historical_models"),
        "uniform": where(rel.path, "pcode/masters/master.py", "torch.FloatTensor([1.0 / n_selected_clients])"),
        "m1_stuck": where(rel.path, wk, "self.avg_teacher = self.init_model"),
        "m1_return": where(rel.path, wk, "if self.conf.buffer_length <= 1:"),
        "vote_branch": where(rel.path, wk, "if self.avg_teacher is None:  # FedGKD-VOTE"),
        "vote_length": where(rel.path, wk, "= {length}"),
        "vote_no_grad": where(rel.path, wk, "with torch.no_grad():"),
        "vote_loss_temperature": where(rel.path, wk, "self.conf.loss_temperature"),
        "activate_4": where(rel.path, ms, "def _activate_selected_clients"),
        "activate_called": where(rel.path, "pcode/masters/master.py", "self.activate_selected_clients("),
        "listen_4": where(rel.path, wk, "msg = torch.zeros((4"),
        "clip": where(rel.path, "pcode/workers/worker.py", "max_norm=10"),
        "readme_typo": where(rel.path, "README.md", "--mathod"),
    }
    result = {
        "released": {"repository": "CGCL-codes/FedGKD", "commit": rel.commit, "path": str(args.released)},
        "stand_ins": rel.stand_ins,
        "readme_command": {"accepted": readme, "refused_by_its_parser": refused},
        "case": {"data": "digits", "clients": CLIENTS, "client_sizes": sizes, "model": "mlp hidden [16]", "M": M,
                 "gamma": gamma, "distillation_coefficient": gamma / 2, "T": T, "local_epochs": E, "batch": "full",
                 "lr": lr, "momentum": 0.9, "weight_decay": wd, "clip_grad_norm": 10.0, "rounds": R},
        "rule": f"agrees: relative difference <= {RTOL:g} (tests/agreement.py ROUNDING)",
        "local_objective": local,
        "rounds": rows,
        "m1_teacher": m1_teacher,
        "vote": vote,
        "broadcast_size_mismatches": info["broadcast_size_mismatches"],
        "lines": lines,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(f"FedGKD released code ({result['released']['repository']} @ {rel.commit[:12]}) against fedrift's fedgkd")
    print(f"digits, {CLIENTS} clients {sizes}, MLP [16], full-batch SGD lr {lr} momentum 0.9 wd {wd} clip 10, "
          f"{E} local epochs, gamma {gamma} (distillation_coefficient {gamma / 2}), T {T:g}")
    print(f"\n{'check':44} {'value released':>15} {'value fedrift':>15} {'loss':>9} {'gradient':>9} {'teacher':>9}")
    for row in local:
        print(f"{row['check']:44} {row['released']:15.8f} {row['fedrift']:15.8f} {row['loss']:9.1e} "
              f"{row['gradient']:9.1e} {row.get('teacher', float('nan')):9.1e}")
    print(f"\n{'global model after':44} {'difference':>10}  verdict")
    for r in rows:
        print(f"{r['check']:44} {r['difference']:10.1e}  {'agrees' if r['difference'] <= RTOL else 'departs'}")
    for r, t in m1_teacher.items():
        print(f"M=1, round {r}: the released workers' teacher is w_0 bit for bit: {t['is_w0']}; "
              f"against w_{r - 1}: {t['vs_w_prev']:.1e}")
    print()
    for attempt in vote["listen_to_master"]:
        print(f"Vote worker's listen_to_master, {attempt}")
    print(f"Vote KD term (called directly, loss_temperature = 1/M set here): released {vote['kd_released']:.8f}, "
          f"fedrift {vote['kd_fedrift']:.8f}, difference {vote['kd']:.1e}, weights {vote['weights']:.1e}; "
          f"gradient: released {vote['released_kd_requires_grad']}, fedrift {vote['fedrift_kd_requires_grad']}")
    print(f"README's FedGKD command: its parser refuses {' '.join(refused)} (dropped; the rest is used)")
    mismatches = info["broadcast_size_mismatches"]
    if mismatches:
        print(f"broadcast: {mismatches[0]}" + (f" (and {len(mismatches) - 1} more ranks)" if len(mismatches) > 1 else ""))
    print("released lines: " + ", ".join(f"{k} {v}" for k, v in lines.items()))
    print(f"{result['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
