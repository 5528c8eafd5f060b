"""Run supervision: start the node processes, collect what they report, stop them all on failure.

This is the parent's side of a fit. Nodes report on one pipe each (never collectives), in the
records of exonet.runtime.messages: StepDone (a step's loss and trace events; quick ones together, as Steps), Evaluated,
Checkpointed, NodeDone (trailing events and, on one rank, the final model), NodeError (the
node raised), and under the online clock Events and Query; the parent answers on each
node's control pipe with StepDecision and Answer.

Besides the pipes the parent watches the processes (one that dies reports its signal)
and the progress array (exonet.runtime.watchdog: one that hangs is named). A node's error may
only be the echo of a peer's failure (a collective's connection reset), so the parent
blames a peer killed by a signal, else the earliest error. Whatever ends the run early
(a failure, Ctrl-C, SIGTERM or SIGHUP: exonet.runtime.signals), every node is stopped first,
then the history and trace so far are saved to the run directory, marked incomplete. The run
directory is the fit's alone while it runs (exonet.runtime.runlock).
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import shutil
import signal
import tempfile
import time
import uuid
import warnings
from dataclasses import replace
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from exonet.errors import NodeFailure
from exonet.rundir import (
    MetricsLog,
    check_links,
    create_run,
    drop_leftovers,
    read_config,
    reopen_run,
    restore_status,
    write_run,
)
from exonet.runtime.checkpoint import CheckpointBook, Resume, load_latest
from exonet.runtime.clock import SimClock, received_event
from exonet.runtime.finish import finish_run
from exonet.runtime.fit_config import FitPlan
from exonet.runtime.fit_result import FitResult
from exonet.runtime.forkserver import context
from exonet.runtime.job import Job
from exonet.runtime.messages import (
    Answer,
    Checkpointed,
    Evaluated,
    NodeDone,
    NodeError,
    NodeMessage,
    Query,
    StepDecision,
    Steps,
)
from exonet.runtime.node import NodeConfig, node_main
from exonet.runtime.pipeline import node_type
from exonet.runtime.record import RunRecord
from exonet.runtime.rendezvous import loopback_store
from exonet.runtime.runlock import RunLock
from exonet.runtime.signals import deferred, stop_signals
from exonet.runtime.transport import ByValue, NodeProcess, check_picklable, pickle_model, shared_by_value, shared_bytes
from exonet.runtime.watchdog import BLOCKED, SLOTS, Watchdog
from exonet.scenario import Scenario
from exonet.strategies.base import Strategy

log = logging.getLogger(__name__)

POLL_S = 0.05
CHECK_S = 0.1
GRACE_S = 2.0
ECHO_S = 0.5  # how long a node's error waits for the failure it may echo (a peer's death or earlier error)


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        if -code == signal.SIGABRT:
            return ("killed by signal SIGABRT (gloo aborts a node whose peers pass a different size to one "
                    "collective: check that every rank passes the same shape and dtype; the node's stderr has "
                    "gloo's own message)")
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code} without reporting an error"


class Supervisor:
    """Starts K nodes, turns their messages into history and trace, and stops them all on any failure.

    Args:
        cfg: the resolved node configuration.
        progress: draw a progress bar.
        meta: the trace's metadata.
        progress_timeout_s: the watchdog's limit (None: no watchdog).
        book: where checkpoint reports are committed, or None.
        resume: the checkpoint this run continues, or None.
        clock: the online simulated clock the nodes train against (``fit(scenario=...)``), or None.
    """

    def __init__(self, cfg: NodeConfig, progress: bool, meta: dict[str, Any], progress_timeout_s: float | None,
                 book: CheckpointBook | None, resume: Resume | None, clock: SimClock | None = None) -> None:
        self.cfg, self.progress_timeout_s, self.book, self.clock = cfg, progress_timeout_s, book, clock
        self.controls: list[Any] = []  # write ends of the clock's decisions, one per node
        self.ctx = context()
        self.pipes: list[Any] = []
        self.beats = self.ctx.Array("d", SLOTS * cfg.world, lock=False)
        self.watchdog: Watchdog | None = None
        self.procs: list[Any] = []
        self.record = RunRecord(cfg.world, cfg.max_steps, meta, resume, progress, cfg.start_step,
                                trainers=cfg.num_nodes)

    def start(self, model_bytes: bytes, train: Any, val: Any, strategy: Strategy) -> None:
        if self.progress_timeout_s is not None:
            self.watchdog = Watchdog(self.beats, self.cfg.world, self.progress_timeout_s)
        # pickled once for all nodes, holding their shared memory; the model's bytes go there too, so a
        # node's start stays small: the parent writes all K without waiting for each node to read a copy.
        # The datasets are placed first: when /dev/shm is small, the model's bytes are what gives way.
        datasets = shared_by_value(train, val)
        try:
            for sent in datasets:
                sent.pickle_now()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            self._cannot_send(exc, train, val, strategy)
        self.shared = (shared_bytes(model_bytes), *datasets)
        for rank in range(self.cfg.world):
            reader, writer = self.ctx.Pipe(duplex=False)
            self.pipes.append(reader)
            control = None
            if self.clock is not None:
                control, decisions = self.ctx.Pipe(duplex=False)
                self.controls.append(decisions)
            p = NodeProcess(target=node_main, name=f"exonet-node-{rank}",
                            args=(rank, ByValue(self.cfg, environ=True), *self.shared,
                                  ByValue(strategy), writer, self.beats, control),
                            kwargs={"node_class": node_type(self.cfg)})
            try:
                # A start cut by Ctrl-C left a request with the forkserver: a node nobody knew of, which stayed
                # until the process ended (and could upset the next fit). The start is whole, then Ctrl-C lands.
                with deferred():
                    p.start()
                    self.procs.append(p)
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                self._cannot_send(exc, train, val, strategy)
            finally:
                writer.close()  # the node holds the only write end: its death reads as end-of-file here
                if control is not None:
                    control.close()
        self.record.started["nodes started"] = time.monotonic()

    def _cannot_send(self, exc: Exception, train: Any, val: Any, strategy: Strategy) -> NoReturn:
        """Raise the TypeError that names what cannot travel to the nodes (pickling ``exc`` failed)."""
        check_picklable({"train_dataset": train, "val_dataset": val, "strategy": strategy,
                         "dataloader_kwargs": self.cfg.dataloader_kwargs})
        raise TypeError(f"fit: the datasets, strategy or dataloader_kwargs cannot be sent to the node "
                        f"processes ({exc})") from None

    def wait(self) -> None:
        """Consume messages until every node is done; raise NodeFailure on the first failure or hang."""
        next_check = 0.0
        while len(self.record.done) < self.cfg.world:
            for rank in self._ready(POLL_S):
                self._receive(rank)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_S
                self._check_alive()
                failure = self.watchdog.check(self.record.done) if self.watchdog is not None else None
                if failure is not None:
                    raise failure

    def _ready(self, timeout: float) -> list[int]:
        """Ranks whose pipe holds a message (or end-of-file)."""
        return [self.pipes.index(r) for r in wait_for([r for r in self.pipes if not r.closed], timeout=timeout)]

    def _next(self, rank: int) -> NodeMessage | Steps | None:
        """One message from ``rank``'s pipe; None at end-of-file (the node exited), closing the pipe."""
        try:
            return self.pipes[rank].recv()
        except EOFError:
            self.pipes[rank].close()
            return None

    def _receive(self, rank: int) -> None:
        msg = self._next(rank)
        if msg is not None:
            self._handle(msg)

    def _handle(self, msg: NodeMessage | Steps) -> None:
        rank = msg.rank
        if type(msg) is Steps:
            for step in msg.steps:
                self._handle(step)
        elif type(msg) is Checkpointed:
            if self.book is not None and self.book.report(rank, msg.step):
                watch = self.record.watch
                self.book.commit(msg.step, *self.record.snapshot(msg.step), watch.references if watch else None)
        elif type(msg) is NodeError:
            raise self._blame(msg)
        else:
            self.record.handle(msg)
            if self.clock is not None and type(msg) is not Evaluated:
                self._tick(rank, msg.events, done=type(msg) is NodeDone,
                           question=msg.question if type(msg) is Query else None)

    def _tick(self, rank: int, events: list, done: bool, question: tuple | None) -> None:
        """Advance the online clock with a node's report; send every node the decisions and answers it allows."""
        clock = self.clock
        assert clock is not None
        clock.feed(rank, events)
        if done:
            clock.close(rank)
        if question is not None:
            clock.ask(rank, question)
        for asker, asked, answer in clock.answers():
            if answer is not None and asked[0] == "recv_any":
                self.record.events[asker].append(received_event(asker, asked, answer))
            self.controls[asker].send(Answer(answer))
        for who, step, go in clock.decisions():
            for pipe in self.controls if who is None else [self.controls[who]]:
                pipe.send(StepDecision(step, go))

    def _blame(self, error: NodeError) -> NodeFailure:
        """The failure to report for a node's error: a peer that died without a word (killed by a signal,
        or exited non-zero with nothing left in its pipe: ``os._exit(3)``), else the earliest error."""
        first, reported = error, {error.rank}
        deadline = time.monotonic() + ECHO_S
        while time.monotonic() < deadline:
            for rank, p in enumerate(self.procs):
                code = p.exitcode
                if code is None or code == 0 or rank in reported or rank in self.record.done:
                    continue
                if code < 0 or self.pipes[rank].closed or not self.pipes[rank].poll(0):
                    return NodeFailure(rank, f"{_exit_reason(code)} (node {error.rank} then failed with: "
                                             f"{error.traceback.rstrip().splitlines()[-1]})")
            for rank in self._ready(0.02):
                msg = self._next(rank)
                if type(msg) is NodeError:
                    first = min(first, msg, key=lambda m: m.at)
                    reported.add(msg.rank)
                elif msg is not None:
                    self._handle(msg)
        return NodeFailure(first.rank, first.traceback.rstrip() + self._timeout_hint(first.traceback))

    def _timeout_hint(self, text: str) -> str:
        """For a collective that timed out: which ranks were not in one then (the likely stragglers)."""
        if "Timed out" not in text and "DistStoreError" not in text:
            return ""
        free = [r for r, p in enumerate(self.procs) if p.exitcode is None and r not in self.record.done
                and not self.beats[r * SLOTS + BLOCKED]]
        who = (f"rank {', '.join(map(str, free))} {'was' if len(free) == 1 else 'were'} not in a collective then"
               if free else "every rank was in one (mismatched calls: another op, group or order on some rank?)")
        return (f"\n(exonet: a collective waited longer than fit's timeout_s={self.cfg.timeout_s:g} s for its "
                f"peers; {who}. Raise timeout_s if a rank is merely slow.)")

    def _check_alive(self) -> None:
        for rank, p in enumerate(self.procs):
            if p.exitcode is None or rank in self.record.done:
                continue  # running, or finished and delivered (a crash in gloo's teardown loses nothing)
            # The node is gone; its error report may still be in the pipe (a DataLoader worker it
            # forked may hold the write end open a while longer, so stop when nothing is left).
            while not self.pipes[rank].closed and self.pipes[rank].poll(0.1):
                self._receive(rank)
            if rank in self.record.done:
                continue
            raise NodeFailure(rank, _exit_reason(p.exitcode))

    def stop(self) -> None:
        """Stop every node still running (SIGTERM, then SIGKILL), and reap them."""
        self.record.close()
        finished = len(self.record.done) == self.cfg.world
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
        for reader in self.pipes:
            reader.close()
        for writer in self.controls:
            writer.close()


def _open_run(config: dict[str, Any], label: str, run_dir: str | os.PathLike | None,
              resume_from: str | os.PathLike | None, follow_symlinks: bool = False,
              ) -> tuple[Path | None, Resume | None, tuple | None, RunLock | None]:
    """The run folder (created now, or the resumed one reopened), the checkpoint to continue from, what the
    reopened folder held (its status and steps, see ``reopen_run``) and the folder's lock, held from here on.

    A resumed folder is checked for links first (``check_links``; ``follow_symlinks`` trusts them), and once
    locked loses the temporary files its killed fit left."""
    if resume_from is None:
        if run_dir is None:
            return None, None, None, None
        path = create_run(run_dir, label, config)
        return path, None, None, RunLock(path)
    path = Path(resume_from)
    check_links(path, follow_symlinks)
    saved = read_config(path)
    ours = json.loads(json.dumps(config, default=repr))
    ignore = {"threads", "checkpoint_interval", "scenario", "run_id"}  # a synchronous run's scenario only replays it
    diff = _differences({k: v for k, v in saved.items() if k not in ignore},
                        {k: v for k, v in ours.items() if k not in ignore})
    if diff:
        details = "; ".join(f"{k}: the run had {a!r}, this fit has {b!r}" for k, a, b in diff)
        raise ValueError(f"resume_from: {path} was run with different settings ({details}); "
                         "resume with the arguments of the original fit")
    lock = RunLock(path)  # before its checkpoint is read: a fit still writing it refuses us here
    try:
        for left in drop_leftovers(path):
            log.info("resume_from: removed %s, left by a fit that was killed while writing it", left)
        return path, load_latest(path, config["num_nodes"]), reopen_run(path), lock
    except BaseException:
        lock.release()
        raise


def _earlier_time(held: tuple | None) -> float:
    """A resumed run's time is every attempt's: what the run it continues took, as its status said."""
    status = held[0] if held is not None else None
    earlier = status.get("real_time_s") if isinstance(status, dict) else None
    return float(earlier) if isinstance(earlier, (int, float)) and math.isfinite(earlier) else 0.0


def _differences(a: Any, b: Any, where: str = "") -> list[tuple[str, Any, Any]]:
    """Where two configs differ, down to the leaf: ("strategy.optim_spec.lr", 0.001, 0.05)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [(where, a, b)]
    return [d for k in sorted(set(a) | set(b), key=str)
            for d in _differences(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))]


def launch(job: Job, plan: FitPlan) -> FitResult:
    """Run a checked fit (``plan``, from ``fit_config.configure``): run directory, rendezvous, nodes, supervision,
    results."""
    strategy, cfg, chosen = job.strategy, job.cfg, plan.scenario
    if chosen is not None:
        chosen.resolve(cfg.world, servers=cfg.servers)  # fail before training, not after
    config = run_config(strategy, cfg, job.model, chosen)
    if plan.extra_config:
        config["kwargs"] = plan.extra_config
    wandb_at = {"project": plan.wandb_project, "name": plan.wandb_run_name, "x_axis": plan.x_axis}
    label = plan.run_name or f"{strategy.name}-k{cfg.num_nodes}"
    meta = {"strategy": type(strategy).__name__, "params": config["params"], "steps": cfg.max_steps}
    if cfg.servers:  # the last ranks serve: a scenario places the trainers without them (Scenario.resolve)
        meta["servers"] = cfg.servers
    if cfg.pipeline is not None:  # the ranks are stages of replicas (exonet.runtime.pipeline)
        meta["pipeline"] = config["pipeline"]
    if dist.is_torchelastic_launched():
        from exonet.runtime.torchrun import train_under_torchrun

        if (plan.resume_from is not None or cfg.checkpoint_interval or cfg.max_sim_time_s is not None
                or strategy.asynchronous):
            raise ValueError("fit: checkpoint_interval, resume_from, max_sim_time_s and asynchronous strategies are "
                             "not supported under torchrun yet")
        is_zero = os.environ.get("RANK") == "0"
        run_path = create_run(plan.run_dir, label, config) if is_zero and plan.run_dir is not None else None
        logger = _wandb(wandb_at, config, run_path) if is_zero else None
        if plan.object_store:  # every host's node finds the others' objects under the run's own prefix
            run_id = os.environ.get("TORCHELASTIC_RUN_ID", "torchrun")
            job = replace(job, cfg=replace(cfg, object_store=f"{plan.object_store.rstrip('/')}/exonet-{run_id}"))
        record, real_time = train_under_torchrun(job, meta, plan.progress and is_zero, logger)
        return finish_run(job, config, record, run_path, real_time, chosen, plan.upload_to, run_name=plan.run_name)
    with stop_signals():  # SIGTERM and SIGHUP stop the run as Ctrl-C does; then the process ends by that signal
        return _launch_here(job, plan, config, label, meta, wandb_at)


def _launch_here(job: Job, plan: FitPlan, config: dict[str, Any], label: str, meta: dict[str, Any],
                 wandb_at: dict[str, Any]) -> FitResult:
    """``launch`` on this machine: K node processes from the forkserver, a rendezvous on loopback."""
    strategy, cfg, scenario, watch = job.strategy, job.cfg, plan.scenario, plan.watch
    model_bytes = pickle_model(job.model)
    store = loopback_store(cfg.world)
    objects = None if plan.object_store else tempfile.mkdtemp(prefix="exonet-objects-")  # comm.put/get's, this fit's
    where = f"{plan.object_store.rstrip('/')}/exonet-{uuid.uuid4().hex[:12]}" if plan.object_store else objects
    cfg = replace(cfg, store_port=store.port, object_store=where)
    run_path, resume, held, lock = _open_run(config, label, plan.run_dir, plan.resume_from, plan.follow_symlinks)
    try:
        book = None
        if cfg.checkpoint_interval and run_path is not None:
            book = CheckpointBook(run_path / "checkpoints", cfg.num_nodes)
            cfg = replace(cfg, checkpoint_dir=str(book.root))
            if resume is not None:
                book.prune()  # the unfinished checkpoints of the fit that was killed: nodes write theirs afresh
        if resume is not None:
            cfg = replace(cfg, resume_dir=str(resume.folder), start_step=resume.step)
        clock = None
        if strategy.asynchronous and scenario is not None:  # the clock chooses the order in this scenario
            meta["decided_in"] = {"scenario": scenario.name, "fingerprint": scenario.fingerprint}
        if strategy.elastic:  # its failed nodes discard their own work (see Simulation's rewind)
            meta["elastic"] = True
        if scenario is not None:  # a strategy may ask the clock whenever there is a scenario; these runs obey it
            decides = cfg.max_sim_time_s is not None or strategy.asynchronous
            clock = SimClock(scenario, cfg.world, math.inf if cfg.max_sim_time_s is None else cfg.max_sim_time_s,
                             cfg.max_steps, trainers=cfg.num_nodes, synchronous=not strategy.asynchronous,
                             what="max_sim_time_s" if cfg.max_sim_time_s is not None else type(strategy).__name__,
                             decides=decides, rewind=not meta.get("elastic", False))
        if clock is not None and resume is not None:  # the clock replays the run it continues first
            for rank, events in enumerate(resume.trace.events):
                clock.feed(rank, events)
        sup = Supervisor(cfg, plan.progress, meta, plan.progress_timeout_s, book, resume, clock)
        sup.record.logger = _wandb(wandb_at, config, run_path)
        sup.record.watch = watch
        if run_path is not None:
            sup.record.metrics = MetricsLog(run_path / "metrics.jsonl", sup.record.history)
        if resume is not None and watch is not None:
            watch.restore(resume.references)
        real_time = _supervise(sup, job, model_bytes, run_path, book, held)
        return finish_run(job, config, sup.record, run_path, real_time, scenario, plan.upload_to, clock, plan.run_name,
                       lock)
    finally:
        if objects is not None:
            shutil.rmtree(objects, ignore_errors=True)
        if lock is not None:
            lock.release()


def _supervise(sup: Supervisor, job: Job, model_bytes: bytes, run_path: Path | None, book: CheckpointBook | None,
               held: tuple | None) -> float:
    """Run the nodes to the end and return the real time (with the earlier attempts' of a resumed run).

    Whatever stops them first (a failure, Ctrl-C, SIGTERM, SIGHUP) propagates once every node is
    stopped and the run so far is saved, marked incomplete; a second signal waits for the save.
    """
    t0 = time.perf_counter()
    finished = False
    try:
        sup.start(model_bytes, job.train_dataset, job.val_dataset, job.strategy)
        sup.wait()
        finished = True
    finally:
        with deferred():
            sup.stop()
            real_time = time.perf_counter() - t0 + _earlier_time(held)
            if book is not None:
                book.prune()
            if run_path is not None and not finished:
                _save_incomplete(sup.record, run_path, held, real_time)
            if sup.record.logger is not None and not finished:
                sup.record.logger.finish(exit_code=1)
    return real_time


def _save_incomplete(record: RunRecord, run_path: Path, held: tuple | None, real_time: float) -> None:
    """Save a stopped run's history and trace, marked incomplete; a failed write is warned about, naming the file,
    so that what stopped the run is what the caller sees."""
    steps = len(record.history["train_loss"])
    try:
        if held is not None and steps <= held[1]:
            restore_status(run_path, held[0])  # a resume that failed before adding a step leaves the run as it was
        else:
            write_run(run_path, *record.snapshot(steps), False, real_time)
    except OSError as exc:
        warnings.warn(f"fit: the stopped run could not be saved: {exc}", stacklevel=6)


def _wandb(at: dict[str, Any], config: dict[str, Any], run_path: Path | None) -> Any:
    """A WandbLogger when ``at`` names a project (lazily imported), else None."""
    if at["project"] is None:
        return None
    from exonet.runtime.wandb_log import WandbLogger

    return WandbLogger(at["project"], config, name=at["name"], dir=str(run_path) if run_path is not None else None,
                       x_axis=at["x_axis"])


def run_config(strategy: Strategy, cfg: NodeConfig, model: torch.nn.Module,
               scenario: Scenario | None = None) -> dict[str, Any]:
    """The resolved configuration written to config.json (``scenario``: the one fit was given, by name)."""
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    keep = ("num_nodes", "max_steps", "batch_size", "minibatch_size", "device_type", "backend", "seed", "shuffle",
            "autocast", "val_interval", "val_size", "threads", "checkpoint_interval", "max_sim_time_s")
    spec = cfg.pipeline
    pipeline = None
    if spec is not None:
        codec = spec.codec  # named by its class: two codecs may share their fields' names
        pipeline = {"stages": spec.stages, "micro_batches": spec.micro_batches, "schedule": spec.schedule,
                    "activation_bytes": spec.activation_bytes, "cuts": None if spec.cuts is None else list(spec.cuts),
                    "codec": None if codec is None else {"type": type(codec).__name__, **vars(codec)},
                    "routing": spec.routing, "skip": spec.skip}
    return {"params": params, **{k: getattr(cfg, k) for k in keep}, "strategy": strategy.config(),
            "scenario": None if scenario is None else scenario.name, "pipeline": pipeline}
