"""TrainNode: one rank's life, from rendezvous to the final averaged model.

The parent (``exonet.runtime.run``) starts one process per node with ``node_main``.
The training step reads top to bottom: batch → loss → backward → strategy.step().
Everything the parent needs (losses, evaluations, checkpoint reports, the trace, the
final model) travels back through a pipe; nothing here draws progress or writes logs.
The node beats into the parent's progress watchdog (exonet.runtime.watchdog) as it goes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from exonet.communicator import Communicator
from exonet.runtime.batches import (
    batch_rows,
    epoch_order,
    gathered_batches,
    is_factory,
    resolve_dataset,
    split_batch,
    to_device,
    validation_sample,
)
from exonet.runtime.checkpoint import load_node, save_node, wait_for_room
from exonet.runtime.clock_link import ClockLink
from exonet.runtime.dist_calls import routed
from exonet.runtime.messages import Checkpointed, Evaluated, NodeDone, NodeError, NodeMessage, Outbox, StepDone
from exonet.runtime.object_store import open_objects
from exonet.runtime.rendezvous import join_store
from exonet.runtime.watchdog import Heartbeat
from exonet.seeding import shared_generator
from exonet.strategies.base import NodeContext, Strategy
from exonet.trace import Compute

if TYPE_CHECKING:
    from exonet.estimate.pipeline import PipelineSpec


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs to know, resolved and validated by the parent."""

    num_nodes: int
    max_steps: int
    batch_size: int
    minibatch_size: int
    device_type: str
    devices: tuple[int, ...] | None
    backend: str
    seed: int
    shuffle: bool = True
    autocast: str | None = None
    val_interval: int = 100
    val_size: int = 64
    threads: int = 1
    count_flops: bool = True
    dataloader_kwargs: dict[str, Any] = field(default_factory=dict)
    store_port: int = 0
    object_store: str | None = None  # where comm.put / comm.get keep objects: a directory or an s3:// prefix
    parent_pid: int = 0
    timeout_s: float = 1800.0
    checkpoint_interval: int = 0
    checkpoint_dir: str | None = None
    resume_dir: str | None = None
    start_step: int = 0
    max_sim_time_s: float | None = None  # the online clock decides whether each step runs (exonet.runtime.clock)
    servers: int = 0  # ranks after the num_nodes trainers that serve (Strategy.servers): the clock always runs
    profile_dir: str | None = None  # fit(profile=True): each trainer's torch.profiler trace, rank{r}.json, here
    pipeline: PipelineSpec | None = None  # the model in stages over the ranks (exonet.runtime.pipeline)

    @property
    def world(self) -> int:
        """Every rank of the run: the trainers, then the servers."""
        return self.num_nodes + self.servers

    @property
    def evaluator(self) -> int:
        """The rank that evaluates and returns the final model: the server if there is one, else rank 0."""
        return self.num_nodes if self.servers else 0


class TrainNode:
    """One rank: data, model, strategy and the step loop."""

    def __init__(self, rank: int, cfg: NodeConfig, model: torch.nn.Module, train_data: Any, val_data: Any,
                 strategy: Strategy, send: Callable[[NodeMessage], None], heartbeat: Heartbeat,
                 clock: ClockLink | None = None, marks: dict[str, float] | None = None) -> None:
        self.rank, self.cfg, self.send, self.heartbeat = rank, cfg, send, heartbeat
        self.marks = {} if marks is None else marks  # when this node reached each part of its start-up
        self.clock = clock  # the online clock: whether each step runs, who a server receives next
        self.device = self._device()
        self.model = model.to(self.device)
        blocking: Callable[..., contextlib.AbstractContextManager[None]] = heartbeat.blocked
        if cfg.profile_dir is not None:  # the profile marks what the trace counts as communication
            from exonet.profile.record import marked

            blocking = marked(blocking)
        self.comm = Communicator(rank, cfg.world, self.device, cfg.backend, blocking=blocking, clock=clock)
        if cfg.object_store is not None:
            self.comm.object_store = open_objects(cfg.object_store, rank, cfg.timeout_s)
        self.strategy = strategy
        self.train_data, self.val_data = train_data, val_data
        self.data_rank, self.data_ranks = rank, cfg.num_nodes  # which shard of how many this node reads
        self.autocast_dtype = getattr(torch, cfg.autocast) if cfg.autocast else None

    def _device(self) -> torch.device:
        kind = self.cfg.device_type
        if kind == "cuda":
            ids = self.cfg.devices or tuple(range(torch.cuda.device_count()))
            index = ids[self.rank % len(ids)]
            torch.cuda.set_device(index)
            return torch.device("cuda", index)
        return torch.device(kind)

    # ----------------------------------------------------------------- data
    # Loaders get private generators: the global RNG (dropout ...) is the model's alone, so
    # a checkpoint's RNG state does not depend on when loaders were created.
    def _setup_strategy(self) -> None:
        """Bind the strategy to this node."""
        cfg = self.cfg
        self._bind(self.model, self.comm, NodeContext(self.rank, cfg.num_nodes, cfg.max_steps, cfg.seed, self.device))

    def _bind(self, model: torch.nn.Module, comm: Any, ctx: NodeContext) -> None:
        """``strategy.setup(model, comm, ctx)``; an override of ``setup`` that skipped the base's is named here."""
        self.strategy.setup(model, comm, ctx)
        if getattr(self.strategy, "comm", None) is not comm:
            name = type(self.strategy).__name__
            raise TypeError(f"{name}.setup did not call super().setup(model, comm, ctx): the base Strategy binds "
                            f"the model, the communicator and the optimizer there")

    def _val_loader(self) -> DataLoader | None:
        if self.val_data is None or self.rank != self.cfg.evaluator:
            return None
        cfg = self.cfg
        ds = resolve_dataset(self.val_data, self.rank, cfg.num_nodes, False)
        # torch's stubs ask for a Dataset; Subset and DataLoader take any map-style object
        sample: Subset[Any] = Subset(ds, validation_sample(len(ds), cfg.val_size, cfg.seed))  # type: ignore[arg-type]
        return DataLoader(sample, batch_size=cfg.batch_size, shuffle=False, generator=torch.Generator(),
                          **cfg.dataloader_kwargs)

    def _batches(self, start_step: int) -> Iterator[Any]:
        """This node's training batches from ``start_step`` on; the skipped ones are never loaded."""
        return self._shard_batches(start_step, self.data_rank, self.data_ranks)

    def _shard_batches(self, start_step: int, rank: int, ranks: int) -> Iterator[Any]:
        """Shard ``rank`` of ``ranks``' batches from ``start_step`` on."""
        cfg = self.cfg
        ds = resolve_dataset(self.train_data, rank, ranks, True)
        shared = not is_factory(self.train_data)

        def order(epoch: int) -> torch.Tensor:
            return epoch_order(len(ds), rank, ranks, cfg.seed, epoch, cfg.shuffle, shared)

        per_epoch = len(order(0)) // cfg.batch_size
        if per_epoch < 1:
            raise ValueError(f"train_dataset gives node {rank} {len(order(0))} samples, fewer than one batch "
                             f"(batch_size={cfg.batch_size}); a factory must give every rank at least one batch")
        epoch, skip = divmod(start_step, per_epoch)
        while True:
            for batch in self._epoch_batches(ds, order(epoch)[skip * cfg.batch_size:], rank, epoch):
                yield to_device(batch, self.device)
            epoch, skip = epoch + 1, 0

    def _epoch_batches(self, ds: Any, order: torch.Tensor, rank: int, epoch: int) -> Iterator[Any]:
        """The batches of samples ``order`` of ``ds`` (shard ``rank``'s, in ``epoch``), as a DataLoader deals them."""
        cfg = self.cfg
        gathered = None if cfg.dataloader_kwargs else gathered_batches(ds, order, cfg.batch_size)
        if gathered is not None:
            return gathered
        ints = chain.from_iterable(part.tolist() for part in order.split(4096))  # the sampler yields ints
        # ds: any map-style object (see _val_loader)
        generator = shared_generator(cfg.seed, "loader", rank, epoch)
        loader: DataLoader[Any] = DataLoader(ds, batch_size=cfg.batch_size, sampler=ints,  # type: ignore[arg-type]
                                             drop_last=True, generator=generator, **cfg.dataloader_kwargs)
        return iter(loader)

    # ----------------------------------------------------------------- loop
    def run(self) -> None:
        """Train (or serve) to the end; the strategy's own ``torch.distributed`` calls run through the
        Communicator meanwhile (``exonet.runtime.dist_calls``)."""
        with routed(self.comm):
            self._run()

    def _run(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self._broadcast_initial_weights()
        if self.rank >= cfg.num_nodes:
            return self._serve()
        batches = self._batches(cfg.start_step)
        val_loader = self._val_loader()
        self._syncing = False
        self._flops_at: list[float] = []
        if cfg.count_flops:  # the FLOP profile's hooks, before the strategy's own, so spans split first
            for i, p in enumerate(self._grad_params()):
                p.register_post_accumulate_grad_hook(lambda _, i=i: self._grad_ready(i))
        self._setup_strategy()
        first = next(batches)
        flops, self._flops_at = self._count_flops(first) if cfg.count_flops else (0.0, [])
        if cfg.resume_dir is not None:
            load_node(Path(cfg.resume_dir), self.rank, self.model, self.strategy)
        self.heartbeat.started()
        self.marks["set up"] = time.monotonic()
        self.comm.begin()

        # a server evaluates itself
        evaluates = bool(cfg.val_interval) and self.val_data is not None and not cfg.servers
        # Asynchronous trainers stop at different steps: rank 0 evaluates its own model, without a collective.
        alone = self.strategy.asynchronous
        done = cfg.start_step
        prof = None
        if cfg.profile_dir is not None:
            from exonet.profile.record import StepProfiler

            prof = StepProfiler(Path(cfg.profile_dir) / f"rank{self.rank}.json", cfg.max_steps - cfg.start_step,
                                cfg.device_type)
        if evaluates and done == 0:  # the seed gym evaluates the initial model too, and its plots start there
            self._evaluate_own(0, val_loader) if alone else self._evaluate(0, val_loader)
        for step in range(cfg.start_step, cfg.max_steps):
            if step > cfg.start_step and self.clock is not None and not self.clock.allows(step):
                break
            batch = first if step == cfg.start_step else next(batches)
            self.model.train()
            self.strategy.zero_grad()
            loss = self._forward_backward(batch)
            self.comm.flops_done(flops)
            self.strategy.step()
            marks = None
            if step == cfg.start_step:
                self.marks["first step"] = time.monotonic()
                marks = self.marks
            events = self.comm.mark_step()
            self.send(StepDone(self.rank, step, loss, events, marks))
            if prof is not None:
                prof.step(sum(e.wall_s for e in events if type(e) is Compute))
            self.heartbeat.beat()
            done = step + 1
            if evaluates and done % cfg.val_interval == 0 and done < cfg.max_steps:
                self._evaluate_own(done, val_loader) if alone else self._evaluate(done, val_loader)
            if cfg.checkpoint_dir is not None and done % cfg.checkpoint_interval == 0 and done < cfg.max_steps:
                self._checkpoint(done)

        if prof is not None:
            prof.stop()
        self.strategy.finish()
        # The last evaluation is of the model fit returns: after the exchanges still in flight have landed
        # (Streaming DiLoCo's overlapped outer step), at the last step or where the clock ended the run.
        if evaluates and (done == cfg.max_steps or done % cfg.val_interval):
            self._evaluate_own(done, val_loader) if alone else self._evaluate(done, val_loader)
        tail = self.comm.take_events()
        state = None if cfg.servers else self._own_state() if alone else self._final_state()
        self.send(NodeDone(self.rank, tail, state))

    def _serve(self) -> None:
        """A server's life: serve the trainers until none is left, evaluating its model every ``val_interval`` updates.

        An evaluation is of the server's own model (the global parameters) after an update, at the
        simulated time the update's message was received; its ``step`` and ``updates`` count updates applied.
        """
        cfg = self.cfg
        val_loader = self._val_loader()
        self._setup_strategy()
        self.heartbeat.started()
        self.marks["set up"] = time.monotonic()
        self.comm.begin()

        last = [0, 0.0, 0]  # the updates applied, the simulated time of the last, the updates last evaluated

        def evaluate(updates: int, sim_time_s: float) -> None:
            with self.comm.bookkeeping(), torch.no_grad():
                loss = self._eval_loss(val_loader)
            last[2] = updates
            self.send(Evaluated(self.rank, updates, {"step": updates, "updates": updates, "loss": loss,
                                                   "sim_time_s": sim_time_s}))

        def updated(updates: int, sim_time_s: float) -> None:
            self.heartbeat.beat()
            last[:2] = updates, sim_time_s
            if val_loader is not None and cfg.val_interval and updates % cfg.val_interval == 0:
                evaluate(updates, sim_time_s)

        if val_loader is not None and cfg.val_interval:  # the initial model, as trainers evaluate theirs
            evaluate(0, 0.0)
        self.strategy.serve(updated)
        if val_loader is not None and cfg.val_interval and last[0] != last[2]:  # the final model, at its final time
            evaluate(int(last[0]), last[1])  # an int (updates), in a list typed float
        tail = self.comm.take_events()
        self.send(NodeDone(self.rank, tail, self._own_state()))

    def _forward_backward(self, batch: Any, sync: bool = True) -> float | None:
        """Forward and backward over the batch's micro-batches; ``sync`` lets the last backward start communication."""
        rows = batch_rows(batch)
        total = 0.0
        micros = split_batch(batch, self.cfg.minibatch_size) if self.cfg.minibatch_size < rows else [(batch, rows)]
        for j, (micro, n) in enumerate(micros):
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                try:
                    loss = self.model(micro)
                except (AttributeError, TypeError) as exc:
                    _explain_forward_error(self.model, micro, exc)
                    raise
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise ValueError(f"model(batch) must return a scalar loss tensor, got {shape}")
            if not loss.requires_grad:
                raise ValueError("model(batch) returned a loss with no grad (requires_grad=False); "
                                 "is the forward pass detached or run under no_grad?")
            self._syncing = sync and j == len(micros) - 1
            self.strategy.prepare_backward(self._syncing)
            (loss * (n / rows)).backward()
            self._syncing = False
            total += loss.item() * n / rows
        return total

    def _grad_params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _grad_ready(self, i: int) -> None:
        """Hook: parameter ``i`` has its gradient; FLOPs up to here belong to the span in progress."""
        if self._syncing and self._flops_at:
            self.comm.flops_done(self._flops_at[i])

    def _count_flops(self, batch: Any) -> tuple[float, list[float]]:
        """FLOPs of one forward+backward, and the FLOPs done by the time each parameter's gradient is ready.

        Counted once; buffers and grads are restored after. The profile lets a strategy that
        communicates from gradient hooks split the step's FLOPs exactly where its spans split.
        """
        from torch.utils.flop_counter import FlopCounterMode

        with self.comm.bookkeeping():
            buffers = [b.detach().clone() for b in self.model.buffers()]
            counter = FlopCounterMode(display=False)
            params = self._grad_params()
            at = [0.0] * len(params)
            hooks = [p.register_post_accumulate_grad_hook(lambda _, i=i: at.__setitem__(i, counter.get_total_flops()))
                     for i, p in enumerate(params)]
            try:
                with counter:
                    self.model.train()
                    self._forward_backward(batch, sync=False)
            finally:
                for h in hooks:
                    h.remove()
            self.strategy.zero_grad()
            with torch.no_grad():
                for b, saved in zip(self.model.buffers(), buffers):
                    b.copy_(saved)
        return float(counter.get_total_flops()), [float(x) for x in at]

    # ------------------------------------------------------- bookkeeping
    def _checkpoint(self, step: int) -> None:
        """Write this node's checkpoint and report it; the parent commits it once all K have."""
        assert self.cfg.checkpoint_dir is not None  # called only when checkpoints are asked for
        root = Path(self.cfg.checkpoint_dir)
        wait_for_room(root, step, self.heartbeat.beat)
        with self.comm.bookkeeping():
            save_node(root, step, self.rank, self.model, self.strategy)
        self.send(Checkpointed(self.rank, step))
        self.heartbeat.beat()

    def _float_tensors(self) -> list[torch.Tensor]:
        return [t for t in (*self.model.parameters(), *self.model.buffers()) if t.is_floating_point()]

    def _broadcast_initial_weights(self) -> None:
        if self.cfg.world == 1:
            return
        with self.comm.bookkeeping(), torch.no_grad():
            for t in (*self.model.parameters(), *self.model.buffers()):
                self.comm.untraced_broadcast(t.data, 0)

    def _averaged_flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This node's flat floating state and the node average (all ranks take part).

        Flattened in float64 when any tensor is float64, so averaging never loses precision.
        """
        tensors = self._float_tensors()
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
        with torch.no_grad():
            local = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])
            avg = local.clone()
            if self.cfg.num_nodes > 1:
                self.comm.untraced_all_reduce(avg)
                avg /= self.cfg.num_nodes
        return local, avg

    def _evaluate(self, step: int, val_loader: DataLoader | None) -> None:
        """Loss of the node-averaged model and of rank 0's own, plus how far nodes have drifted apart."""
        k = self.cfg.num_nodes
        with self.comm.bookkeeping(), torch.no_grad():
            local, avg = self._averaged_flat()
            params = torch.cat([p.detach().reshape(-1).float() for p in self.model.parameters()])
            z = (params - params.mean()) / (params.std(unbiased=False) * params.numel() ** 0.5 + 1e-12)
            stats = torch.cat([((local - avg).norm()).reshape(1).float(), z])
            if k > 1:
                self.comm.untraced_all_reduce(stats)
            if self.rank != 0:
                return
            drift = float(stats[0]) / k
            zsum = stats[1:]
            correlation = 1.0 if k == 1 else float((zsum.dot(zsum) - k) / (k * (k - 1)))
            local_loss = self._eval_loss(val_loader)
            saved = local.clone()
            self._load_flat(avg)
            loss = self._eval_loss(val_loader)
            self._load_flat(saved)
            self.send(Evaluated(0, step, {"step": step, "loss": loss, "local_loss": local_loss,
                                        "drift": drift, "correlation": correlation}))

    def _load_flat(self, flat: torch.Tensor) -> None:
        offset = 0
        for t in self._float_tensors():
            n = t.numel()
            t.data.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    def _eval_loss(self, loader: DataLoader | None) -> float:
        if loader is None:
            return float("nan")
        self.model.eval()
        total, rows = 0.0, 0
        for batch in loader:
            batch = to_device(batch, self.device)
            n = batch_rows(batch)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                total += float(self.model(batch)) * n
            rows += n
            self.heartbeat.beat()  # a long evaluation on rank 0 is progress, not a hang
        return total / max(rows, 1)

    def _final_state(self) -> bytes | None:
        """The node-averaged model (integer buffers from rank 0), serialised on rank 0."""
        with self.comm.bookkeeping():
            _, avg = self._averaged_flat()
            if self.rank != 0:
                return None
            self._load_flat(avg)
            return self._own_state()

    def _own_state(self) -> bytes | None:
        """This node's model, serialised (the final model of a server, or of rank 0 in an asynchronous run)."""
        if self.rank != self.cfg.evaluator:
            return None
        with self.comm.bookkeeping():
            buf = io.BytesIO()
            torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, buf)
            return buf.getvalue()

    def _evaluate_own(self, step: int, val_loader: DataLoader | None) -> None:
        """Loss of rank 0's own model (asynchronous trainers: no collective, the others may have stopped)."""
        if self.rank != 0:
            return
        with self.comm.bookkeeping(), torch.no_grad():
            loss = self._eval_loss(val_loader)
        self.send(Evaluated(0, step, {"step": step, "loss": loss, "local_loss": loss}))


def _explain_forward_error(model: torch.nn.Module, batch: Any, exc: Exception) -> None:
    """Raise a TypeError saying what exonet passes, when ``model(batch)`` failed on a forward
    that takes the batch apart.

    A forward such as nanoGPT's ``forward(idx, targets=None)`` receives the whole batch as ``idx`` and
    fails deep inside (``'list' object has no attribute 'device'``); nothing is added to other errors.
    """
    import inspect

    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return
    if len(params) < 2 or not isinstance(batch, (list, tuple)):
        return
    names = ", ".join(p.name for p in params)
    raise TypeError(
        f"model(batch) failed ({type(exc).__name__}: {exc}). exonet calls model(batch) with the whole batch (here a "
        f"{type(batch).__name__} of {len(batch)}) and needs a scalar loss back, but {type(model).__name__}.forward "
        f"takes ({names}). Wrap it: class WithLoss(nn.Module): def forward(self, batch): "
        f"return self.model(*batch)  (returning the loss; for nanoGPT's GPT, self.model(*batch)[1])") from exc


# --------------------------------------------------------------- process entry
def _watch_parent(parent_pid: int) -> None:
    """Exit if the parent disappears, so no node outlives the run. A parent that died but is not reaped yet (a
    zombie, whose own parent may be waiting on the pipes this node holds) counts as gone."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        if _is_zombie(parent_pid):
            os._exit(1)


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (Linux's /proc; elsewhere, never said)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].startswith("Z")


def node_main(rank: int, cfg: NodeConfig, model_bytes: Any, train_data: Any, val_data: Any,
              strategy: Strategy, pipe: Any, beats: Any = None, control: Any = None,
              node_class: type[TrainNode] | None = None) -> None:
    """Process entry point: run the node; on any error send the traceback to the parent and exit non-zero.

    ``pipe`` is this node's write end to the parent (exonet.runtime.run lists the messages); ``beats`` is the
    parent's shared progress array (exonet.runtime.watchdog), or None when nobody watches; ``control`` is the
    read end of the online clock's step decisions (exonet.runtime.clock), or None. ``model_bytes`` is the
    model as torch.save wrote it: a uint8 array over the parent's shared memory, or the bytes themselves.
    ``node_class`` is the rank's kind (``exonet.runtime.pipeline.node_type``; default TrainNode).
    """
    marks = {"forked": time.monotonic()}
    for signum in (signal.SIGINT, signal.SIGHUP):  # a terminal sends them to us too: the parent stops us
        signal.signal(signum, signal.SIG_IGN)
    heartbeat = Heartbeat(beats, rank)
    if cfg.parent_pid:
        threading.Thread(target=_watch_parent, args=(cfg.parent_pid,), daemon=True).start()
    torch.set_num_threads(cfg.threads)
    code = 0
    send: Callable[[NodeMessage], None] = pipe.send
    try:
        from exonet.runtime.transport import Unloadable

        for name, arg in (("model", model_bytes), ("train_dataset", train_data), ("val_dataset", val_data),
                          ("strategy", strategy)):
            if isinstance(arg, Unloadable):
                raise ImportError(f"{name}: {arg.error}")
        from datetime import timedelta

        with heartbeat.blocked("rendezvous"):
            store = join_store(cfg.store_port, cfg.world)
            dist.init_process_group(cfg.backend, store=store, rank=rank, world_size=cfg.world,
                                    timeout=timedelta(seconds=cfg.timeout_s))
        marks["joined"] = time.monotonic()
        model = torch.load(io.BytesIO(model_bytes), weights_only=False)
        marks["loaded"] = time.monotonic()
        clock = None if control is None else ClockLink(control, pipe.send, rank, heartbeat.blocked,
                                                       gated=cfg.max_sim_time_s is not None,
                                                       announces=strategy.asynchronous)
        if clock is None:  # the online clock decides each step from its report: those go at once
            send = Outbox(pipe.send)
        node = (node_class or TrainNode)(rank, cfg, model, train_data, val_data, strategy, send, heartbeat, clock,
                                         marks)
        node.run()
    except BaseException:
        send(NodeError(rank, traceback.format_exc(), time.monotonic()))
        code = 1
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        pipe.close()
    sys.exit(code)
