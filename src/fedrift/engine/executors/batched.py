"""K clients trained at once: one ``torch.func.vmap`` over stacked parameters and optimiser state.

Each local step of K clients is one vectorised call of the same pure step the sequential
executor runs. Clients with fewer samples in a batch get padded rows with sample weight 0; a
client whose steps are done leaves the vectorised call (its model and optimiser state taken
out, the next steps train the others only: nothing is spent on it, where masking its steps
had left about two thirds of a group's work padding under Dirichlet(0.1) client sizes,
BENCHMARKS.md G). Every client ends where the sequential executor leaves it up to float
rounding: not bit for bit, as vmap runs other kernels (batched matrix products, convolutions
in the default layout rather than channels-last), for as many clients as are still training.
Tested (tests/engine/test_batched.py): after 3 rounds every parameter within 1e-4 of its
tensor's largest value and metrics within 1e-3 relative, for every algorithm on a tiny MLP;
the FedAvg CNN within 1e-4 after one round (the differences grow with rounds). Clients are
grouped by step count, longest first, where a round has more clients than one group holds.

BatchNorm models (``model.norm: batch``): the running statistics are stacked with the
parameters (a client that has finished takes them with it), and padded rows are left out of
the batch statistics (``models/norm.py``): the same statistics as ``sequential`` to float
rounding.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

import numpy as np
import torch
from torch.func import vmap

from fedrift.engine import step_values
from fedrift.engine.local import make_step, optimizer_init
from fedrift.engine.profiling import labeller
from fedrift.engine.round_types import ClientJob, ClientOutput, RoundTools
from fedrift.engine.stacked_step import make_vstep
from fedrift.engine.step_graphs import Capture, StepGraphs, cuda_capture, width
from fedrift.functional.tree import cat, split, stack


def _rows(tree: Any, keep: torch.Tensor, dims: Any = 0) -> Any:
    """The rows ``keep`` of every tensor of ``tree`` batched on its leading axis (``dims``: the
    tree's ``vmap`` in-dims, the same nesting or one value for all; None: not batched, kept
    whole); other leaves as they are."""
    if dims is None:
        return tree
    if isinstance(tree, torch.Tensor):
        return tree.index_select(0, keep)
    if isinstance(tree, dict):
        return {k: _rows(v, keep, dims[k] if isinstance(dims, dict) else dims) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_rows(v, keep, dims[i] if isinstance(dims, (tuple, list)) else dims) for i, v in enumerate(tree))
    return tree


Shrink = tuple[torch.Tensor, list[int], torch.Tensor, torch.Tensor | None]


def _leaving(steps: list[int], size: Callable[[int], int] | None,
             dev: torch.device) -> tuple[torch.Tensor | None, dict[int, Shrink]]:
    """How a group of clients taking ``steps`` local steps shrinks as they finish: the first
    step's padding rows (None: none), and for each step at which some have finished, the rows
    of the group's tensors to keep (the clients still training; with ``size``, a captured
    step's widths, the first of them repeated up to ``size(count)``), those clients' positions
    in the group (a list, and the same on the device), and the step batch's padding rows
    (None: none). Every index tensor in one host-to-device copy: made one by one, each is a
    copy that waits for the device (torch synchronises a copy from pageable memory), so a
    GPU's host would stop at every client's end and wait for the steps it had queued (the
    H200's profile: one wait a step)."""
    flat: list[int] = []
    wide = size or (lambda count: count)

    def put(values: list[int]) -> slice:
        flat.extend(values)
        return slice(len(flat) - len(values), len(flat))

    def padding(count: int) -> slice | None:
        return put(list(range(count)) + [0] * (wide(count) - count)) if wide(count) > count else None

    first = padding(len(steps))
    alive, plan = list(range(len(steps))), {}
    for s in sorted(set(steps))[:-1]:  # the last: every client is done, the group too
        keep = [r for r, i in enumerate(alive) if steps[i] > s]
        alive = [alive[r] for r in keep]
        plan[s] = (put(keep + keep[:1] * (wide(len(keep)) - len(keep))), alive, put(alive), padding(len(alive)))
    table = torch.tensor(flat, dtype=torch.int64).to(dev)
    cut = lambda part: None if part is None else table[part]  # noqa: E731
    return cut(first), {s: (cut(r), a, cut(at), cut(f)) for s, (r, a, at, f) in plan.items()}


def _index_table(jobs: list[ClientJob], steps: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``idx[s, k, :]``: client k's batch at step s, padded with its first sample; ``w``: the
    sample weights, 1/len for real rows and 0 for padding and for steps past the client's end."""
    dev = jobs[0].indices.device
    table = torch.full((len(jobs), steps, batch_size), -1, dtype=torch.int64, device=dev)
    for k, job in enumerate(jobs):  # one copy per client; the rest is done on the whole table
        table[k, : job.num_steps, : job.table.shape[1]] = job.table
    real = table >= 0
    first = torch.stack([job.indices[0] for job in jobs]).view(-1, 1, 1)
    idx = torch.where(real, table, first)
    w = real / real.sum(-1, keepdim=True).clamp(min=1)
    return idx.transpose(0, 1).contiguous(), w.transpose(0, 1).contiguous()


GPU_GROUP_SHARE = 4  # a GPU's vectorised group may take 1/4 of its memory (the rest: data, states, evaluation)


def auto_parallel(params: dict[str, torch.Tensor], batch_size: int, sample_numel: int) -> int:
    """How many clients to vectorise: bounded by a memory budget for parameters, gradients,
    optimiser state and activations: a rough 256 MB per group on the CPU, at most 256
    clients; on a GPU a quarter of its memory, at most 4,096 clients (stacked runs put a
    compare's seeds in one group: ResNet-8 at batch 64 is about 28 MB a client, 9 a group
    within the CPU's budget, over a thousand within an H200's).

    A vectorised step holds about 8 model-sized tensors per client at its peak (parameters
    before and after, gradients, optimiser and client state, the update chain's temporaries):
    measured on S4's SCAFFOLD MLP, a group of 86 clients raised peak memory by 450 MB."""
    per_client = 4 * (8 * sum(p.numel() for p in params.values()) + 32 * batch_size * sample_numel)
    device = next(iter(params.values())).device if params else torch.device("cpu")
    if device.type == "cuda":
        budget, cap = torch.cuda.get_device_properties(device).total_memory // GPU_GROUP_SHARE, 4096
    else:
        budget, cap = 256 * 2**20, 256
    return int(max(1, min(cap, budget // max(per_client, 1))))


def _functional_step(tools: RoundTools, algorithm: Any, optimizer: Any) -> Any:
    """The local step of ``algorithm`` and ``optimizer`` with ``tools``' model, for ``vmap``."""
    return make_step(algorithm, tools.vmap_apply or tools.apply, optimizer, functional=True, dp=tools.dp,
                     precision=tools.precision)


class BatchedExecutor:
    """``graphs``: on a GPU, the vectorised step captured as CUDA graphs (``engine.step_graphs``;
    ``engine.cuda_graphs``); a capture function instead of True captures with it on any device
    (the tests' CPU stand-in, ``step_graphs.eager_capture``). ``compiled``: the step's stacked
    form compiled (``engine.compile``, ``engine.stacked_step.compiled_form``)."""

    def __init__(self, max_parallel_clients: int | None = None, graphs: bool | Capture = True,
                 compiled: bool = False) -> None:
        self.max_parallel = max_parallel_clients
        self.graphs = graphs
        self.compiled = compiled
        self._steps: dict[Any, Any] = {}

    def close(self) -> None:
        """Nothing to release: this executor runs in the calling process."""

    hands_over = True  # run_round's take: each group's outputs handed over as they are made (Server.take)

    def run_round(
        self, tools: RoundTools, payload: dict[str, Any], jobs: list[ClientJob], round_: int,
        take: Callable[[ClientOutput], None] | None = None,
    ) -> list[ClientOutput]:
        part = Part(tools, payload, jobs, round_)
        width = batch_width([part])
        values = [step_values.values_of(tools)] if self.keeps_graphs(tools) else None
        outputs: dict[int, ClientOutput] = {}
        for group in self.groups([part]):
            for job, out in zip(group[0][1].jobs, self.train_group([g for _, g in group], width, values=values)[0]):
                outputs[job.client_id] = out
                if take is not None:
                    take(out)
        return [outputs[j.client_id] for j in jobs]

    def groups(self, parts: list["Part"]) -> list[list[tuple[int, "Part"]]]:
        """The vectorised groups that train ``parts``' clients: at most K clients each (K from
        ``engine.max_parallel_clients``, else :func:`auto_parallel`), longest clients first
        (less masked work per group), then in part and job order (the order in which ``take``
        folds the outputs, so that clients of equal length are not held waiting). A group is
        a list of (index in ``parts``, that part with the jobs of it that the group trains)."""
        first = parts[0]
        params = first.tools.start_params(first.payload, first.jobs[0].ctx) if first.jobs else first.payload["params"]
        k = self.max_parallel or auto_parallel(params, batch_width(parts), int(first.tools.x[0].numel()))
        flat = sorted(((p, i) for p, part in enumerate(parts) for i in range(len(part.jobs))),
                      key=lambda pi: (-parts[pi[0]].jobs[pi[1]].num_steps, pi[0], pi[1]))
        out = []
        for start in range(0, len(flat), k):
            chosen: dict[int, list[ClientJob]] = {}
            for p, i in flat[start : start + k]:
                chosen.setdefault(p, []).append(parts[p].jobs[i])
            out.append([(p, replace(parts[p], jobs=jobs)) for p, jobs in chosen.items()])
        return out

    def vstep(self, tools: RoundTools, payload_dims: Any = None, valued: bool = False) -> Any:
        """The step of ``tools``' algorithm and optimiser under ``vmap`` (made once per pair, and
        per way the payload is batched: shared by every client, or one row per client).
        ``valued``: the step built at each client's values (``engine.step_values``: stacked runs
        at other learning rates or options), made once per run's ``Rebuild``."""
        key = ("valued", id(tools.rebuild)) if valued else (id(tools.algorithm), id(tools.optimizer))
        if key not in self._steps:  # one batched step per (algorithm, optimiser): training, personalisation
            make = partial(_functional_step, tools)
            step = step_values.valued(make, tools.rebuild) if valued else make(tools.algorithm, tools.optimizer)
            self._steps = {key: (tools.algorithm, tools.optimizer, step, {})}
        step, vsteps = self._steps[key][2], self._steps[key][3]
        dims_key = repr(payload_dims)
        if dims_key not in vsteps:
            # the model's stacked form where it has one (engine.stacked_step); else each client's step vmapped
            fast = make_vstep(tools, payload_dims, valued, self.compiled)
            vsteps[dims_key] = fast or vmap(step, in_dims=(0, 0, 0, payload_dims, 0))
            capture = self._capture(tools)
            if capture is not None:
                vsteps[dims_key] = StepGraphs(vsteps[dims_key], capture)
        return vsteps[dims_key]

    def _capture(self, tools: RoundTools) -> Capture | None:
        """How this executor captures ``tools``' step (None: it runs op by op)."""
        return self.graphs if callable(self.graphs) else cuda_capture if self.graphs and tools.x.is_cuda else None

    def keeps_graphs(self, tools: RoundTools) -> bool:
        """Whether ``tools``' step reads its learning rate as a tensor (``engine.step_values``)
        though it is the run's own: under ``train.lr_schedule`` with the step captured, so the
        run keeps its graphs from round to round (a step built at each round's rate would be
        captured anew every round)."""
        return tools.schedule is not None and tools.rebuild is not None and self._capture(tools) is not None

    def graph_counts(self) -> dict[str, Any]:
        """What the captured steps did (benchmarks report it): captures, replays, seconds spent
        capturing, and a capture's error if one failed."""
        graphed = [v for entry in self._steps.values() for v in entry[3].values() if isinstance(v, StepGraphs)]
        return {"captures": sum(g.captures for g in graphed), "replays": sum(g.replays for g in graphed),
                "capture_seconds": sum(g.capture_seconds for g in graphed),
                "failed": next((g.failed for g in graphed if g.failed), None)}

    def train_group(self, parts: list["Part"], batch_size: int, stop: Callable[[], None] | None = None,
                    step_tools: RoundTools | None = None, values: list[dict[str, float]] | None = None,
                    ) -> list[list[ClientOutput]]:
        """One vectorised group: the clients of ``parts`` (each part one run's jobs, with its
        tools, payload and round) trained together, one ``vmap`` call a local step, every batch
        padded to ``batch_size`` rows (the round's widest); their outputs, per part in job
        order. With one part the payload is shared by every client (as it is); with several
        (stacked runs, ``executors.stacked``) each client gets its run's payload as a row of a
        stacked one, and the step is ``step_tools``' (default: the first part's; the runs share
        one config: a stack hands the same run's tools to all its groups, so that one step, and
        on a GPU one set of captured graphs, serves them all). ``values``: per part, the values
        its step trains at where the parts' differ (``engine.step_values``; None: the step's
        own). ``stop`` is called before every step (it raises to stop the group: a stacked
        run's Ctrl-C)."""
        first = parts[0]
        tools0, dev = first.tools, first.tools.x.device
        alg = tools0.algorithm  # every part's algorithm trains with this step (stacked runs: one config)
        ctxs: list[dict[str, Any]] = []
        for part in parts:
            a = part.tools.algorithm
            for job in part.jobs:
                ctx = job.context()
                if a.client_start is not None:
                    with torch.no_grad():
                        ctx.update(a.client_start(part.payload, ctx, part.tools.client_data(job, part.payload), part.tools.apply))
                ctxs.append(ctx)
        ctx = stack(ctxs)
        sizes = [len(part.jobs) for part in parts]
        if values is not None:
            ctx[step_values.VALUES] = step_values.value_rows(values, sizes, dev)
        jobs = [job for part in parts for job in part.jobs]
        n = len(jobs)
        if len(parts) == 1:
            payload, payload_dims = first.payload, None
        else:
            payload, payload_dims = per_client_payload(parts)
        if alg.personal:
            params = tools0.start_params(first.payload, ctx)  # the clients' own models, stacked with ctx
        elif alg.client_model is not None:  # the broadcast (expanded) with each client's own part
            params = cat([vmap(partial(part.tools.start_params, part.payload))(c)
                           for part, c in zip(parts, split(ctx, sizes))])
        else:
            params = cat([{name: p.unsqueeze(0).expand(len(part.jobs), *p.shape) for name, p in part.payload["params"].items()}
                           for part in parts])
        if alg.optimizer_start is None:
            opt_state = vmap(partial(optimizer_init, tools0.optimizer, apply=tools0.apply))(params)
        else:  # each client's own context, and in a stack its run's algorithm (vmap batches positional arguments only)
            rebuild = (step_tools or tools0).rebuild if values is not None else None

            def init(p: Any, c: Any) -> Any:
                a = alg if rebuild is None else rebuild.pieces(c[step_values.VALUES])[0]
                return optimizer_init(tools0.optimizer, p, tools0.apply, a.optimizer_start, c)

            opt_state = vmap(init)(params, ctx)
        vstep = self.vstep(step_tools or tools0, payload_dims, valued=values is not None)
        steps = [j.num_steps for j in jobs]
        # a captured or compiled step's rows: the clients still training, then the first of them
        # repeated up to one of a few widths (those rows' results are not read): a graph, or a
        # compile, for each width, not for each number of clients left
        padded = isinstance(vstep, StepGraphs) or self.compiled
        fill, leaving = _leaving(steps, width if padded else None, dev)
        if fill is not None:
            params, opt_state, ctx, payload = (_rows(params, fill), _rows(opt_state, fill), _rows(ctx, fill),
                                               _rows(payload, fill, payload_dims))
        idx_all, w_all = _index_table(jobs, max(steps), batch_size)
        loss_sum = torch.zeros(n, device=dev)
        aux_sum: dict[str, torch.Tensor] = {}
        views_all = _views_table(parts, max(steps), batch_size, dev)
        label = labeller()
        alive = list(range(n))  # the clients still training, in group order: the rows of params, opt_state, ...
        at = torch.arange(n, device=dev)  # ... and the same on the device
        ends: dict[int, dict[str, torch.Tensor]] = {}  # the models of the clients that have finished

        def take_out(done: set[int]) -> None:  # the finished clients' rows of params, copied out
            for r, i in enumerate(alive):
                if i in done:
                    ends[i] = {name: p[r].clone() for name, p in params.items()}

        for s in range(max(steps)):
            if stop is not None:
                stop()
            if s in leaving:  # some finished: the step trains the others only
                rows, still, at, fill = leaving[s]
                take_out(set(alive) - set(still))
                params, opt_state, ctx = _rows(params, rows), _rows(opt_state, rows), _rows(ctx, rows)
                payload = _rows(payload, rows, payload_dims)
                alive = still
            with label("fedrift.batch"):  # labels for torch.profiler (benchmarks/gpu_throughput.py)
                batch = _step_batch(parts, idx_all[s], w_all[s], s, batch_size, None if views_all is None else views_all[s],
                                    (alive, at) if len(alive) < n else None)
                if fill is not None:
                    batch = _rows(batch, fill)
            with label("fedrift.step"):
                params, opt_state, loss, aux = vstep(params, opt_state, batch, payload, ctx)
            if fill is not None:  # the real rows only (the rest: a captured or compiled step's padding)
                loss, aux = loss[: len(alive)], {key: v[: len(alive)] for key, v in aux.items()}
            loss_sum = loss_sum.index_add(0, at, loss)
            for key, v in aux.items():
                aux_sum[key] = aux_sum.get(key, torch.zeros(n, *v.shape[1:], dtype=v.dtype, device=v.device)).index_add(0, at, v)
        take_out(set(alive))
        outs: list[list[ClientOutput]] = []
        i = 0
        for part in parts:
            a, mine = part.tools.algorithm, []
            for job in part.jobs:
                end = ends[i]
                if a.client_end is not None:
                    with torch.no_grad():
                        ctxs[i].update(a.client_end(part.payload, end, ctxs[i], part.tools.client_data(job, part.payload), part.tools.apply))
                upload, state = a.client_result(part.payload, end, ctxs[i])
                h = max(steps[i], 1)
                aux_i = {key: v[i] / h for key, v in aux_sum.items()}
                mine.append(ClientOutput(job.client_id, upload, state, loss_sum[i] / h, aux_i, end))
                i += 1
            outs.append(mine)
        return outs


@dataclass
class Part:
    """One run's share of a vectorised group: its training tools, the round's payload, the
    jobs of its clients in the group, and the round (which keys their random draws)."""

    tools: RoundTools
    payload: dict[str, Any]
    jobs: list[ClientJob]
    round_: int


def batch_width(parts: list[Part]) -> int:
    """The widest batch of any client in ``parts`` (narrower ones are padded to it)."""
    return max((j.table.shape[1] for part in parts for j in part.jobs), default=1)


def _views_table(parts: list[Part], steps: int, batch_size: int, dev: torch.device) -> torch.Tensor | None:
    """The augmentation views of every client of the group at every step, ``(steps, clients,
    batch, 3)`` on the device in one copy (each client's own draws, ``Augment.draws``; zeros
    past its last step, where its steps are masked); None without augmentation."""
    if parts[0].tools.augment is None:
        return None
    table = np.zeros((steps, sum(len(p.jobs) for p in parts), batch_size, 3), dtype=np.int64)
    i = 0
    for part in parts:
        aug, seed = part.tools.augment, part.tools.seed
        for job in part.jobs:
            table[: job.num_steps, i] = aug.draws(seed, part.round_, job.client_id, range(job.num_steps), batch_size)
            i += 1
    return torch.from_numpy(table).to(dev)


def _step_batch(parts: list[Part], idx: torch.Tensor, w: torch.Tensor, s: int, batch_size: int,
                views: torch.Tensor | None, alive: tuple[list[int], torch.Tensor] | None = None) -> dict[str, Any]:
    """Step ``s``'s batch of the group's clients still training (``alive``: their positions in
    the parts' job order, as a list and as a tensor on the device; None: all): the rows ``idx`` (client x batch) gathered with each
    client's own draws (noise, DP noise: keyed by its run's seed, its round, itself and the
    step; ``views``, the step's rows of :func:`_views_table`). One gather for the group when
    the parts share their training set and no teacher reads the batch; else one per part,
    joined."""
    order, rows = alive if alive is not None else (None, None)
    own: list[list[int]] = []  # each part's jobs still training, by position in the part
    start = 0
    for part in parts:  # alive is in order: each part's share is one slice of it
        end = start + len(part.jobs)
        own.append(list(range(len(part.jobs))) if order is None else
                   [i - start for i in order[bisect_left(order, start):bisect_left(order, end)]])
        start = end
    if rows is not None:
        idx, w, views = idx[rows], w[rows], None if views is None else views[rows]

    def draws(part: Part, mine: list[int]) -> tuple[Any, Any]:
        t, r, jobs = part.tools, part.round_, [part.jobs[i] for i in mine]
        noise = None if t.algorithm.noise_dim is None else torch.stack([t.noise(r, j.client_id, s, batch_size) for j in jobs])
        dp = stack([t.dp_noise(r, j.client_id, s) for j in jobs]) if t.dp is not None else None
        return noise, dp

    t0 = parts[0].tools
    if len(parts) == 1 or (t0.algorithm.teacher is None and all(p.tools.x is t0.x and p.tools.y is t0.y for p in parts)):
        got = [draws(p, mine) for p, mine in zip(parts, own) if mine]
        noise, dp = (None if got[0][k] is None else cat([g[k] for g in got]) for k in range(2))
        return t0.batch(parts[0].payload, idx, w, noise=noise, views=views, dp_noise=dp)
    out, at = [], 0
    for part, mine in zip(parts, own):
        n = len(mine)
        if not n:
            continue
        noise, dp = draws(part, mine)
        rows_of = None if views is None else views[at : at + n]
        out.append(part.tools.batch(part.payload, idx[at : at + n], w[at : at + n], noise=noise, views=rows_of, dp_noise=dp))
        at += n
    return cat(out)


def payload_signature(payload: Any) -> Any:
    """What :func:`per_client_payload` needs the same in every part, as a key: the payload's
    keys, its tensors' shapes and dtypes, and its other values."""
    if isinstance(payload, torch.Tensor):
        return ("tensor", tuple(payload.shape), payload.dtype)
    if isinstance(payload, dict):
        return tuple((k, payload_signature(v)) for k, v in payload.items())
    if isinstance(payload, (list, tuple)):
        return (type(payload).__name__, tuple(payload_signature(v) for v in payload))
    return repr(payload)


def per_client_payload(parts: list[Part]) -> tuple[dict[str, Any], Any]:
    """The parts' payloads as one with a row per client (each client its run's), and the
    ``vmap`` in-dims that say so: 0 for every tensor, None for the other values, which must be
    the same in every part (a run's settings, equal in runs of one config)."""
    def rows(values: list[Any], counts: list[int]) -> tuple[Any, Any]:
        v0 = values[0]
        if isinstance(v0, torch.Tensor):
            return torch.cat([v.unsqueeze(0).expand(c, *v.shape) for v, c in zip(values, counts)]), 0
        if isinstance(v0, dict):
            both = {k: rows([v[k] for v in values], counts) for k in v0}
            return {k: b[0] for k, b in both.items()}, {k: b[1] for k, b in both.items()}
        if isinstance(v0, (list, tuple)):
            both = [rows([v[i] for v in values], counts) for i in range(len(v0))]
            return type(v0)(b[0] for b in both), type(v0)(b[1] for b in both)
        if any(v != v0 for v in values[1:]):
            raise ValueError(f"stacked runs: a payload value differs between runs ({v0!r}); they cannot share a step")
        return v0, None

    return rows([p.payload for p in parts], [len(p.jobs) for p in parts])
