"""The end of a finished fit: its FitResult, run directory, upload, simulation and reports.

Split from ``exonet.runtime.run`` (which starts and supervises the nodes): once every node is done,
``finish_run`` turns the parent's record into what ``fit`` returns and leaves on disk.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from exonet.rundir import write_run
from exonet.runtime.clock import SimClock
from exonet.runtime.fit_result import FitResult
from exonet.runtime.job import Job
from exonet.runtime.record import RunRecord
from exonet.runtime.runlock import RunLock
from exonet.runtime.signals import deferred
from exonet.scenario import Scenario
from exonet.units import format_time

log = logging.getLogger(__name__)


def finish_run(job: Job, config: dict[str, Any], record: RunRecord, run_path: Path | None,
            real_time: float, scenario: Scenario | None, upload_to: str | None, clock: SimClock | None = None,
            run_name: str | None = None, lock: RunLock | None = None) -> FitResult:
    """The FitResult of a finished run; its run directory, upload, simulation and wandb summary.

    With a scenario, the history gains ``sim_time_s`` (each step's simulated end) and every
    evaluation its ``sim_time_s``; a clocked run's simulation is the online clock's own. A write
    that fails (a full disk) does not lose the trained model: the result comes back with the error
    in ``save_error`` and a warning naming the file. ``lock`` (the run directory's) is released
    once the directory is written, before the upload copies it.
    """
    model = copy.deepcopy(job.model)
    if record.state is not None:
        model.load_state_dict(torch.load(io.BytesIO(record.state), weights_only=True))
    result = FitResult(model=model, history=record.history, trace=record.trace(), config=config, real_time_s=real_time,
                       startup=record.startup())
    try:
        with deferred():  # a signal now waits for the run directory to be whole
            _gym_logs(result, config, run_path, run_name)
            if run_path is not None:
                result.run_dir = write_run(run_path, result.history, result.trace, True, real_time)
    except OSError as exc:
        result.save_error = exc
        warnings.warn(f"fit: the finished run could not be saved: {exc}; the returned FitResult holds the model, "
                      "history and trace (its save_error is this error)", stacklevel=5)
    if lock is not None:
        lock.release()
    if result.run_dir is not None and upload_to is not None:
        from exonet.runtime.storage import upload_run

        upload_run(result.run_dir, upload_to)
    if scenario is not None:
        decided = clock if clock is not None and clock.decides else None  # the clock that decided the run
        if decided:  # (simulate() reads a pipeline's stages off the trace; the clock's own replay is told them)
            sim = decided.result(record.history["train_loss"])
            pipeline = config["pipeline"]
            result.sim = sim if pipeline is None else dataclasses.replace(sim, stages=pipeline["stages"])
        else:
            result.sim = result.simulate(scenario)
        ends = result.sim.step_end_times
        result.history["sim_time_s"] = list(ends)
        if decided and not decided.synchronous:  # rank 0 evaluated its own model, at its own steps
            ends = decided.sim.rank_step_ends(0)
        for entry in result.history["eval"]:  # a server's evaluations carry their own (exonet.runtime.node)
            if "sim_time_s" not in entry:
                entry["sim_time_s"] = ends[entry["step"] - 1] if 0 < entry["step"] <= len(ends) else 0.0
        result.sim_wall_clock_s = result.sim.wall_clock_s
        _final_eval_at_end(result.history["eval"], result.sim.wall_clock_s)
        if decided and decided.gated:
            _say_who_stopped_early(decided, result.trace, config["num_nodes"], config["max_steps"])
        log.info("simulated wall-clock in %s: %.3f s (real run: %.3f s)", scenario.name, result.sim.wall_clock_s,
                 real_time)
        if not dist.is_torchelastic_launched() or os.environ.get("RANK") == "0":  # one voice under torchrun
            print(f"exonet: real {format_time(real_time)} on this machine; simulated "
                  f"{format_time(result.sim.wall_clock_s)} in scenario {scenario.name!r}")
    if record.logger is not None:
        if result.sim is not None:
            record.logger.log_simulation(result.sim)
        record.logger.finish()
    return result


def _final_eval_at_end(evals: list[dict[str, Any]], wall_clock_s: float) -> None:
    """A server's last evaluation is of the final model: it holds until the run ends, so give the curve that point.

    The server's model changes only with an update, and the run ends after its last one (the
    trainers receive the parameters, or stop at the budget); the entry added, ``final``, carries
    the last evaluation's loss at the run's final simulated time.
    """
    served = [e for e in evals if "updates" in e]
    if not served:
        return
    last = max(served, key=lambda e: e["updates"])
    if last.get("sim_time_s", 0.0) < wall_clock_s:
        evals.append({**last, "sim_time_s": wall_clock_s, "final": True})


def _say_who_stopped_early(clock: SimClock, trace: Any, trainers: int, max_steps: int) -> None:
    """Warn, naming the rank, its step and simulated time, for a trainer that stopped before the time budget."""
    for rank in range(trainers):
        ends = clock.sim.rank_step_ends(rank)
        if ends and ends[-1] < clock.limit_s and trace.num_steps(rank) >= max_steps:
            warnings.warn(f"fit: rank {rank} stopped at step {len(ends)}, at {ends[-1]:.3f} s simulated, before the "
                          f"max_sim_time_s budget of {clock.limit_s:g} s: it reached max_steps={max_steps} "
                          "(from max_steps or num_epochs; give only max_sim_time_s to train until the budget)",
                          stacklevel=6)


def _gym_logs(result: FitResult, config: dict[str, Any], run_path: Path | None, run_name: str | None) -> None:
    """The older gym's train.csv and validation.csv: in the run directory, and, with a run_name, where the gym wrote
    them whatever ``save_dir`` says (``logs/<run_name>/``), so that a gym script's plotting code finds them."""
    from exonet.runtime.gymlog import GYM_LOG_DIR, replicas, write_gym_csv

    folders = [run_path] if run_path is not None else []
    if run_name is not None:
        folders.append(Path(GYM_LOG_DIR) / run_name)
    if not dist.is_torchelastic_launched() or os.environ.get("RANK") == "0":
        for folder in folders:
            write_gym_csv(folder, result.history, config["batch_size"] * replicas(config))
