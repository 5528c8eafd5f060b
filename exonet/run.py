"""Run supervision: start the node processes, collect what they report, stop them all on failure.

This is the parent's side of a fit. Messages from nodes (a queue, never collectives):

* ``("step", rank, step, loss, events)``: a finished step with that step's trace events;
* ``("eval", 0, step, {...})``: an evaluation from rank 0;
* ``("done", rank, events, state)``: trailing events, and on rank 0 the averaged model;
* ``("error", rank, traceback_text)``: the node raised.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import pickle
import queue as queue_mod
import signal
import time
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from exonet.errors import NodeFailure
from exonet.node import NodeConfig, node_main
from exonet.result import FitResult
from exonet.rundir import new_run_path, write_run
from exonet.strategies.base import Strategy
from exonet.trace import Event, Trace

if TYPE_CHECKING:
    from exonet.trainer import LocalTrainer

log = logging.getLogger(__name__)

POLL_S = 0.05
GRACE_S = 2.0


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "exonet.node"])
    return ctx


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without reporting an error"


def _unpicklable(objects: dict[str, Any]) -> str:
    """Name the first object that cannot be pickled, for a useful error."""
    for name, obj in objects.items():
        try:
            pickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to see
            return f"{name} cannot be pickled ({type(exc).__name__}: {exc})"
    return "an argument could not be pickled"


class Supervisor:
    """Starts K nodes, turns their messages into history and trace, and stops them all on any failure."""

    def __init__(self, cfg: NodeConfig, progress: bool) -> None:
        self.cfg = cfg
        self.ctx = _context()
        self.queue = self.ctx.Queue()
        self.procs: list[Any] = []
        self.history: dict[str, list] = {"train_loss": [], "eval": []}
        self.events: list[list[Event]] = [[] for _ in range(cfg.num_nodes)]
        self.state: bytes | None = None
        self._losses: dict[int, dict[int, float]] = {}
        self._done: set[int] = set()
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=cfg.max_steps, desc=f"exonet K={cfg.num_nodes}", unit="step", leave=False)

    def start(self, model_bytes: bytes, train: Any, val: Any, strategy: Strategy) -> None:
        for rank in range(self.cfg.num_nodes):
            p = self.ctx.Process(target=node_main, name=f"exonet-node-{rank}",
                                 args=(rank, self.cfg, model_bytes, train, val, strategy, self.queue))
            try:
                p.start()
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                what = _unpicklable({"train_dataset": train, "val_dataset": val, "strategy": strategy})
                raise TypeError(
                    f"fit: {what}. Nodes are separate processes started by spawning, so the model, datasets, "
                    "factories and strategy must be picklable: define classes and functions at module top level "
                    f"(not lambdas, local classes or open handles). Original error: {exc}"
                ) from None
            self.procs.append(p)

    def wait(self) -> None:
        """Consume messages until every node is done; raise NodeFailure on the first failure."""
        while len(self._done) < self.cfg.num_nodes:
            try:
                msg = self.queue.get(timeout=POLL_S)
            except queue_mod.Empty:
                self._check_alive()
                continue
            self._handle(msg)

    def _handle(self, msg: tuple) -> None:
        kind, rank = msg[0], msg[1]
        if kind == "step":
            _, _, step, loss, events = msg
            self.events[rank].extend(events)
            row = self._losses.setdefault(step, {})
            row[rank] = loss
            self._flush_losses()
        elif kind == "eval":
            self.history["eval"].append(msg[3])
        elif kind == "done":
            self.events[rank].extend(msg[2])
            if rank == 0:
                self.state = msg[3]
            self._done.add(rank)
        elif kind == "error":
            raise NodeFailure(rank, msg[2].rstrip())

    def _flush_losses(self) -> None:
        k = self.cfg.num_nodes
        nxt = len(self.history["train_loss"])
        while len(self._losses.get(nxt, ())) == k:
            row = self._losses.pop(nxt)
            self.history["train_loss"].append(sum(row.values()) / k)
            nxt += 1
            if self._bar is not None:
                self._bar.update(1)
                self._bar.set_postfix(loss=f"{self.history['train_loss'][-1]:.4f}", refresh=False)

    def _check_alive(self) -> None:
        for rank, p in enumerate(self.procs):
            if p.exitcode is None or (p.exitcode == 0 and rank in self._done):
                continue
            # The node is gone; its error report may still be in the pipe.
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                try:
                    self._handle(self.queue.get(timeout=0.1))
                except queue_mod.Empty:
                    continue
            if rank in self._done and p.exitcode == 0:
                continue
            raise NodeFailure(rank, _exit_reason(p.exitcode))

    def stop(self) -> None:
        """Stop every node still running (SIGTERM, then SIGKILL), and reap them."""
        if self._bar is not None:
            self._bar.close()
        finished = len(self._done) == self.cfg.num_nodes
        deadline = time.monotonic() + GRACE_S
        for p in self.procs:
            if finished:  # nodes are tearing down their process groups: let them exit cleanly
                p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=GRACE_S)
        self.queue.close()
        self.queue.cancel_join_thread()


def launch(trainer: "LocalTrainer", strategy: Strategy, cfg: NodeConfig, *, progress: bool,
           scenario: Any, run_dir: str | os.PathLike | None) -> FitResult:
    """Run a validated fit: rendezvous, nodes, supervision, results, run directory."""
    if scenario is not None:
        from exonet.scenario import Scenario

        scenario = Scenario.coerce(scenario)
        scenario.resolve(cfg.num_nodes)  # fail before training, not after
    store = dist.TCPStore("127.0.0.1", 0, cfg.num_nodes, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    cfg = replace(cfg, store_port=store.port)
    buf = io.BytesIO()
    try:
        torch.save(trainer.model, buf)
    except Exception as exc:  # noqa: BLE001 - pickling can fail in many ways
        raise TypeError(f"fit: the model cannot be pickled ({type(exc).__name__}: {exc}). Nodes are separate "
                        "processes started by spawning, so the model must be picklable: define its class at "
                        "module top level.") from None
    sup = Supervisor(cfg, progress)
    t0 = time.perf_counter()
    try:
        sup.start(buf.getvalue(), trainer.train_dataset, trainer.val_dataset, strategy)
        sup.wait()
    finally:
        sup.stop()
    real_time = time.perf_counter() - t0

    model = copy.deepcopy(trainer.model)
    if sup.state is not None:
        model.load_state_dict(torch.load(io.BytesIO(sup.state), weights_only=True))
    config = run_config(strategy, cfg, model)
    trace = Trace(cfg.num_nodes, meta={"strategy": type(strategy).__name__, "params": config["params"],
                                       "steps": cfg.max_steps}, events=sup.events)
    result = FitResult(model=model, history=sup.history, trace=trace, config=config, real_time_s=real_time)
    if run_dir is not None:
        label = f"{getattr(strategy, 'name', type(strategy).__name__.lower())}-k{cfg.num_nodes}"
        result.run_dir = write_run(new_run_path(run_dir, label), config, result.history, trace, True, real_time)
    if scenario is not None:
        result.sim = result.simulate(scenario)
        log.info("simulated wall-clock in %s: %.3f s (real run: %.3f s)", scenario.name, result.sim.wall_clock_s, real_time)
        print(f"exonet: real {real_time:.2f} s on this machine; simulated {result.sim.wall_clock_s:.2f} s "
              f"in scenario {scenario.name!r}")
    return result


def run_config(strategy: Strategy, cfg: NodeConfig, model: torch.nn.Module) -> dict[str, Any]:
    """The resolved configuration written to config.json."""
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    keep = ("num_nodes", "max_steps", "batch_size", "minibatch_size", "device_type", "backend", "seed", "shuffle",
            "autocast", "val_interval", "val_size", "threads")
    return {"params": params, **{k: getattr(cfg, k) for k in keep}, "strategy": strategy.config()}
