"""torch.profiler around a node's training steps (``fit(profile=True)``): the trace ``estimate --profile`` reads.

Each step is one ``ProfilerStep#N`` span; shapes are recorded so gradients match parameters by shape.
On CUDA the device's kernels are recorded too, so gradients are ready when their kernels end, not
when the CPU launched them.

Two things the reader cannot see in a profile alone are written into it:

* every call the node blocks in (a collective, its wait, a message) is a ``exonet::<call>`` annotation,
  so the reader leaves out of compute exactly what the trace counts as communication. Without it a
  node descheduled on a busy machine, between the backend's op ending and the call returning, counted
  as compute (a loaded 2-core run profiled 5-9 ms steps whose traced compute was 2 ms);
* the profiler's own overhead: the first steps run unprofiled (``reference_steps``), and the traced
  compute of each step, profiled or not, goes into the file as ``exonet_step_compute``, so the reader
  can measure the overhead and take it out.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from exonet.profile.kineto import BLOCKED, MIN_STEPS, STEP_COMPUTE


def reference_steps(steps: int) -> int:
    """Steps left unprofiled at the start of a ``steps``-step run: a quarter, where that leaves the first (a
    warm-up) and one more to compare against, and the profiled part keeps ``MIN_STEPS`` after its own warm-up."""
    unprofiled = steps // 4
    return unprofiled if unprofiled >= 2 and steps - unprofiled >= MIN_STEPS + 1 else 0


def marked(blocking: Callable[..., contextlib.AbstractContextManager[Any]]
           ) -> Callable[..., contextlib.AbstractContextManager[None]]:
    """The Communicator's ``blocking`` context, also an ``exonet::<call>`` annotation in the profile."""

    @contextlib.contextmanager
    def both(call: str = "", peer: int = -1, cid: int = -1) -> Iterator[None]:
        with torch.profiler.record_function(BLOCKED + call), blocking(call, peer, cid):
            yield

    return both


class StepProfiler:
    """A started profiler over ``steps`` training steps, the first ``reference_steps(steps)`` unprofiled; it
    writes ``path`` after the last step (or at ``stop``), with each step's traced compute."""

    def __init__(self, path: str | Path, steps: int, device_type: str) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device_type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.steps, self.unprofiled = steps, reference_steps(steps)
        self.compute_s: list[float] = []
        self._stamped = False
        with warnings.catch_warnings():  # no warm-up step: the reader drops the first step itself, and says so
            warnings.filterwarnings("ignore", message=".*won't be using warmup")
            schedule = torch.profiler.schedule(wait=self.unprofiled, warmup=0,
                                               active=max(1, steps - self.unprofiled), repeat=1)
            self._prof = torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                                on_trace_ready=lambda p: p.export_chrome_trace(str(path)))
        self._prof.start()

    def step(self, compute_s: float) -> None:
        """One step ended, having computed ``compute_s`` as the trace counts it."""
        self.compute_s.append(compute_s)
        if len(self.compute_s) == self.steps:
            self._stamp()  # before the step that writes the file
        self._prof.step()

    def stop(self) -> None:
        """End profiling (a run the clock ended early writes its steps so far)."""
        self._stamp()
        self._prof.stop()

    def _stamp(self) -> None:
        """The traced compute of the unprofiled and the profiled steps, each less its first (a warm-up)."""
        if self._stamped or len(self.compute_s) <= self.unprofiled:
            return
        self._stamped = True
        unprofiled, profiled = self.compute_s[:self.unprofiled], self.compute_s[self.unprofiled:]
        self._prof.add_metadata_json(STEP_COMPUTE, json.dumps({"unprofiled_s": unprofiled[1:],
                                                               "profiled_s": profiled[1:]}))
