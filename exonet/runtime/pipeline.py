"""A model in stages, trained for real: ``fit(pipeline=PipelineSpec(...))`` on a ``Staged`` model.

``Staged(layers, loss)`` is a model whose forward is ``loss(layers(batch[0]), batch[1])``; run whole it
is any other model. Under a pipeline of S stages, the K = S·R ranks are R replicas of S stages: rank
``q·S + s`` runs stage s of replica q, the layers ``[cut(s), cut(s+1))`` (cuts from the spec, else
balanced by parameter count), and the last stage also runs the loss. A step cuts the batch into M
micro-batches and runs the schedule of ``exonet.estimate.pipeline.order`` (GPipe or 1F1B): a forward
receives its input from the previous stage (blocking) and sends its output to the next (posted, waited
at the step's end); a backward receives its output's gradient and sends its input's back. Each of those
is a real, counted, traced point-to-point message, so the replay times the bubble and the links between
stages. Every replica of a stage reads the same batches (shard q of R), and the strategy keeps a stage's
replicas in step through a ``GroupView`` of R ranks (with R = 1 it exchanges nothing).

Every rank holds the whole model (the parent ships one), so evaluation and the final model assemble it
outside the algorithm: one untraced all-reduce of each rank's own stage, zeros elsewhere, divided by R.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch
from torch import nn

from exonet.communicator.view import GroupView
from exonet.estimate.pipeline import PipelineSpec, stage_work
from exonet.runtime.batches import batch_rows, split_batch
from exonet.runtime.messages import Evaluated
from exonet.runtime.node import NodeConfig, TrainNode
from exonet.strategies.base import NodeContext

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from exonet.runtime.boundary import BoundaryCodec


class Staged(nn.Module):
    """A model a pipeline can cut: ``layers`` run in order on ``batch[0]``, then ``loss(output, batch[1])``.

    Args:
        layers: the modules in order (an ``nn.Sequential`` or a list); a pipeline cuts between them.
        loss: a module or a module-level function (it travels to the nodes by pickle), returning a scalar.
    """

    layers: nn.Sequential
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def __init__(self, layers: Sequence[nn.Module], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.layers = layers if isinstance(layers, nn.Sequential) else nn.Sequential(*layers)
        if len(self.layers) < 1:
            raise ValueError("Staged: layers must hold at least one module")
        self.loss = loss

    def forward(self, batch: Any) -> torch.Tensor:
        inputs, targets = _inputs_and_targets(batch)
        return self.loss(self.layers(inputs), targets)


def _inputs_and_targets(batch: Any) -> tuple[Any, Any]:
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        shape = f"a {type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (list, tuple)) else "")
        raise TypeError(f"Staged: a batch must be (inputs, targets), got {shape}")
    return batch[0], batch[1]


def stage_bounds(model: Staged, spec: PipelineSpec) -> list[tuple[int, int]]:
    """Each stage's layers ``[start, end)``: the spec's cuts, else cuts balancing the parameters per stage."""
    n, S = len(model.layers), spec.stages
    if S > n:
        raise ValueError(f"pipeline: stages={S} is more than the model's {n} layers")
    cuts = list(spec.cuts) if spec.cuts is not None else _balanced_cuts(model.layers, S)
    if len(cuts) != S - 1 or cuts != sorted(set(cuts)) or (cuts and not 0 < cuts[0] <= cuts[-1] < n):
        raise ValueError(f"pipeline: cuts must be {S - 1} increasing layer indices in (0, {n}), got {spec.cuts!r}")
    edges = [0, *cuts, n]
    return list(zip(edges, edges[1:]))


def _balanced_cuts(layers: nn.Sequential, stages: int) -> list[int]:
    """The cuts whose largest stage holds the fewest parameters (every stage keeps a layer; the earliest such cuts)."""
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    n = len(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    # best[s][i]: the smallest largest stage of the first i layers in s stages, and where the last stage starts
    best = [[(float("inf"), 0)] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0, 0)
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            best[s][i] = min((max(best[s - 1][j][0], prefix[i] - prefix[j]), j) for j in range(s - 1, i))
    cuts, i = [], n
    for s in range(stages, 1, -1):
        i = best[s][i][1]
        cuts.append(i)
    return cuts[::-1]


def check_chain(model: Staged, spec: PipelineSpec, sample: Any) -> None:
    """Run one sample through the stages in the parent, before any node starts: a stage that cannot take what
    the one before gives is a ValueError naming both (the model left as it was: evaluation mode, no gradient,
    its random state restored)."""
    inputs, targets = _inputs_and_targets(sample)
    bounds = stage_bounds(model, spec)
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            h = inputs
            for s, (start, end) in enumerate(bounds):
                took_in = h
                try:
                    h = model.layers[start:end](h)
                except Exception as exc:
                    took = "the batch's inputs" if s == 0 else f"stage {s - 1}'s output ({_described(h)})"
                    raise ValueError(f"fit: pipeline stage {s} (layers {start}..{end - 1}) cannot take {took}: "
                                     f"{type(exc).__name__}: {exc}") from exc
                if spec.skip and 0 < s < len(bounds) - 1 and _described(h) != _described(took_in):
                    raise ValueError(f"fit: pipeline.skip={spec.skip:g} passes over stage {s} (layers {start}.."
                                     f"{end - 1}), so its output must have its input's shape and dtype: it takes "
                                     f"{_described(took_in)} and gives {_described(h)}")
            try:
                model.loss(h, targets)
            except Exception as exc:
                raise ValueError(f"fit: the Staged model's loss cannot take the last stage's output "
                                 f"({_described(h)}) and the batch's targets: {type(exc).__name__}: {exc}") from exc
    finally:
        model.train(training)


def _described(x: Any) -> str:
    return f"shape {tuple(x.shape)}, {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__


class Stage(nn.Module):
    """One stage's modules (shared with the whole model): what its strategy trains."""

    def __init__(self, layers: nn.Module, loss: Any) -> None:
        super().__init__()
        self.layers = layers
        self.loss = loss if isinstance(loss, nn.Module) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Boundary:
    """One side of a stage boundary: what this stage sends a neighbour and receives from one (tensors of one
    shape each way: activations forward, their gradients back), as they are or through the spec's codec."""

    def __init__(self, comm: Any, shape: torch.Size, dtype: torch.dtype, codec: BoundaryCodec | None) -> None:
        self.comm, self.shape, self.dtype = comm, shape, dtype
        self.coder = None if codec is None else codec.coder(shape)

    def send(self, tensor: torch.Tensor, peer: int) -> tuple[Any, torch.Tensor]:
        """Post ``tensor`` (encoded, with a codec) to ``peer``; the handle and the buffer it sends."""
        payload = tensor.contiguous() if self.coder is None else self.coder.encode(tensor)
        return self.comm.send(payload, peer, async_op=True), payload

    def receive(self, peer: int) -> torch.Tensor:
        """``peer``'s next tensor (decoded, with a codec), blocking."""
        device = self.comm.device
        if self.coder is None:
            return self.comm.recv(torch.empty(self.shape, dtype=self.dtype, device=device), peer)
        wire = self.comm.recv(torch.empty(self.coder.wire_nbytes, dtype=torch.uint8, device=device), peer)
        return self.coder.decode(wire, self.dtype)


class PipelineNode(TrainNode):
    """A rank that runs one stage of one replica (``TrainNode`` with the step, data, strategy world and
    evaluation of a pipeline)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec = self.cfg.pipeline
        assert spec is not None and isinstance(self.model, Staged)  # fit checked both
        self.spec, self.staged = spec, self.model
        S = spec.stages
        self.replica, self.stage = divmod(self.rank, S)
        self.replicas = self.cfg.num_nodes // S
        self.data_rank, self.data_ranks = self.replica, self.replicas
        start, end = stage_bounds(self.staged, spec)[self.stage]
        self.last = self.stage == S - 1
        self.routed = spec.routing is not None and self.replicas > 1
        self._step = self.cfg.start_step  # the step _forward_backward runs next: it draws the routes
        self.stage_module = Stage(self.staged.layers[start:end], self.staged.loss if self.last else None)
        self._boundaries: tuple[Boundary | None, Boundary | None] | None = None  # to the stage before, after
        self._flops = (0.0, 0.0)

    # ----------------------------------------------------------- the strategy
    def _setup_strategy(self) -> None:
        cfg, S = self.cfg, self.spec.stages
        groups = [[q * S + s for q in range(self.replicas)] for s in range(S)]
        view = GroupView(self.comm, groups[self.stage], groups, f"stage{self.stage}/")
        if self.replicas > 1:
            self.comm.declare_groups(groups)
        self._bind(self.stage_module, view, NodeContext(self.replica, self.replicas, cfg.max_steps, cfg.seed,
                                                        self.device))

    # ------------------------------------------------------------- the step
    def _count_flops(self, batch: Any) -> tuple[float, list[float]]:
        """Learn the stage's boundary shapes (and FLOPs per micro-batch) once; FLOPs are then added per
        forward and backward, as they run."""
        self._probe(batch)
        return 0.0, []

    def _probe(self, batch: Any) -> None:
        """One micro-batch through the whole model, outside the run: each cut's shape and dtype, and this stage's
        forward and backward FLOPs."""
        from torch.utils.flop_counter import FlopCounterMode

        micro = self._micro_batches(self._own(batch))[0][0]
        inputs, targets = _inputs_and_targets(micro)
        bounds = stage_bounds(self.staged, self.spec)
        with self.comm.bookkeeping(), torch.random.fork_rng(devices=[]), self._autocast():
            with torch.no_grad():
                h = inputs
                for s in range(self.stage):
                    h = self.staged.layers[bounds[s][0]:bounds[s][1]](h)
            if self.stage and not (isinstance(h, torch.Tensor) and h.is_floating_point()):
                raise TypeError(f"pipeline: stage {self.stage - 1}'s output is not a floating-point tensor "
                                f"({getattr(h, 'dtype', type(h).__name__)}); cut where activations carry a gradient")
            x = h.detach().requires_grad_(True) if self.stage else h
            counter = FlopCounterMode(display=False)
            with counter:
                out = self.stage_module(x)
            forward = counter.get_total_flops()
            with counter:
                if self.last:
                    self.staged.loss(out, targets).backward()
                else:
                    out.backward(torch.ones_like(out))
            backward = counter.get_total_flops() - forward
        for p in self.stage_module.parameters():
            p.grad = None
        if not self.last and not out.is_floating_point():
            raise TypeError(f"pipeline: stage {self.stage}'s output is not a floating-point tensor ({out.dtype}); "
                            "cut where activations can carry a gradient")
        codec = self.spec.codec
        self._boundaries = (None if not self.stage else Boundary(self.comm, x.shape, x.dtype, codec),
                            None if self.last else Boundary(self.comm, out.shape, out.dtype, codec))
        self._flops = (float(forward), float(backward)) if self.cfg.count_flops else (0.0, 0.0)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def _micro_batches(self, batch: Any) -> list[tuple[Any, int]]:
        rows = batch_rows(batch)
        return split_batch(batch, rows // self.spec.micro_batches)

    def _batches(self, start_step: int) -> Iterator[Any]:
        """The replica's batches; a routed last stage's are every replica's (a list of R per step), since the
        micro-batches it ends may come from any of them and their targets are read where the loss is."""
        if not (self.routed and self.last):
            return super()._batches(start_step)
        return (list(step) for step in zip(*(self._shard_batches(start_step, q, self.replicas)
                                             for q in range(self.replicas))))

    def _own(self, batch: Any) -> Any:
        """This replica's batch out of what ``_batches`` gave."""
        return batch[self.replica] if self.routed and self.last else batch

    def _forward_backward(self, batch: Any, sync: bool = True) -> float | None:  # type: ignore[override]
        """One step of the schedule over the micro-batches routed to this stage; the loss on the last stage,
        else None (routed: the whole step's loss, on replica 0's last stage only)."""
        if self._boundaries is None:
            self._probe(batch)
        assert self._boundaries is not None
        inbound, outbound = self._boundaries
        shards = batch if self.routed and self.last else None
        rows = batch_rows(self._own(batch))
        micros = {q: self._micro_batches(shard) for q, shard in enumerate(shards)} if shards else {
            self.replica: self._micro_batches(batch)}
        live: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}  # (source, micro) -> (in, out)
        posted: list[tuple[Any, torch.Tensor]] = []  # sends in flight, with the buffers they send
        total = 0.0
        for work in stage_work(self.spec, self.rank, self.replicas, self._step, self.cfg.seed):
            item = (work.source, work.micro)
            if work.kind == "F":
                x = (None if inbound is None or work.before is None
                     else inbound.receive(work.before).requires_grad_(True))
                with self._autocast():
                    out = self.stage_module(micros[work.source][work.micro][0][0] if x is None else x)
                    if self.last:
                        micro, n = micros[work.source][work.micro]
                        out = self.staged.loss(out, micro[1]) * (n / rows)
                self.comm.add_flops(self._flops[0])
                if outbound is None or work.after is None:
                    total += float(out.detach())
                else:
                    posted.append(outbound.send(out.detach(), work.after))
                live[item] = (x, out)
            else:
                x, out = live.pop(item)
                out.backward() if outbound is None or work.after is None else out.backward(outbound.receive(work.after))
                self.comm.add_flops(self._flops[1])
                if inbound is not None and work.before is not None:
                    assert x is not None and x.grad is not None
                    posted.append(inbound.send(x.grad, work.before))
        for handle, _ in posted:
            handle.wait()
        self._step += 1
        if self.spec.drawn:  # a stage no micro-batch reached steps on zeros, as the others step
            for p in self.stage_module.parameters():  # (DDP averages them: the replicas' summed gradient is the same)
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        return self._step_loss(total) if self.routed else total if self.last else None

    def _step_loss(self, total: float) -> float | None:
        """A routed step's loss: the last stages' sums of their micro-batches' shares, added by one untraced
        all-reduce (bookkeeping, not the algorithm's) and averaged over the replicas' batches, on one rank."""
        with self.comm.bookkeeping():
            summed = torch.tensor([total if self.last else 0.0], dtype=torch.float64, device=self.device)
            self.comm.untraced_all_reduce(summed)
        return float(summed) / self.replicas if self.rank == self.spec.stages - 1 else None

    # ------------------------------------------------------ the whole model
    def _assembled(self, replica: int | None) -> torch.Tensor:
        """The whole model's float state, flat: every stage's tensors from ``replica``'s rank (None: averaged over
        the replicas), assembled on every rank by one untraced all-reduce."""
        own = {id(t) for t in (*self.stage_module.parameters(), *self.stage_module.buffers())}
        tensors = self._float_tensors()
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
        mine = replica is None or replica == self.replica
        with torch.no_grad():
            flat = torch.cat([t.detach().reshape(-1).to(dtype) if mine and id(t) in own
                              else torch.zeros(t.numel(), dtype=dtype, device=t.device) for t in tensors])
            self.comm.untraced_all_reduce(flat)
            if replica is None:
                flat /= self.replicas
        return flat

    def _evaluate(self, step: int, val_loader: DataLoader | None) -> None:
        """Loss of the replica-averaged model and of replica 0's, assembled on rank 0, which evaluates both."""
        with self.comm.bookkeeping(), torch.no_grad():
            own = torch.cat([t.detach().reshape(-1) for t in self._float_tensors()]).clone()
            average, first = self._assembled(None), self._assembled(0)
            if self.rank != 0:
                return
            self._load_flat(average)
            loss = self._eval_loss(val_loader)
            self._load_flat(first)
            local_loss = self._eval_loss(val_loader)
            self._load_flat(own)
            self.send(Evaluated(0, step, {"step": step, "loss": loss, "local_loss": local_loss}))

    def _final_state(self) -> bytes | None:
        """The replica-averaged model, assembled and serialised on rank 0."""
        with self.comm.bookkeeping():
            average = self._assembled(None)
            if self.rank != 0:
                return None
            self._load_flat(average)
            return self._own_state()


def node_type(cfg: NodeConfig) -> type[TrainNode]:
    """The class a rank of this fit runs as: a pipeline's stage, or a whole-model node."""
    return PipelineNode if cfg.pipeline is not None else TrainNode
