"""torch.profiler around a node's training steps (``fit(profile=True)``): the trace ``estimate --profile`` reads.

Each step is one ``ProfilerStep#N`` span (a schedule with every step active); shapes are recorded so
gradients match parameters by shape. On CUDA the device's kernels are recorded too, so gradients are
ready when their kernels end, not when the CPU launched them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch


def step_profiler(path: str | Path, steps: int, device_type: str) -> torch.profiler.profile:
    """A started profiler whose ``step()`` ends each of ``steps`` training steps; it writes ``path`` after the last."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with warnings.catch_warnings():  # no warm-up step: the reader drops the first step itself, and says so
        warnings.filterwarnings("ignore", message=".*won't be using warmup")
        schedule = torch.profiler.schedule(wait=0, warmup=0, active=max(1, steps), repeat=1)
        prof = torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                      on_trace_ready=lambda p: p.export_chrome_trace(str(path)))
    prof.start()
    return prof
