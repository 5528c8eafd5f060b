"""Reading a large torch.profiler trace: seconds and peak memory of ``exonet.profile.read_profile``.

    python -m exonet.bench profile [--mb 200] [--keep PATH]

A Kineto-shaped GPU trace of about ``--mb`` MB is generated (``write_trace``: ``ProfilerStep`` spans, a
forward op, backward ops ending in one AccumulateGrad per parameter with its shape, the optimizer step,
and filler CPU ops each with a ``cudaLaunchKernel`` and its kernel, as a real trace is mostly made of),
then read in a fresh interpreter, which reports its wall seconds and peak RSS (``ru_maxrss``) above what
it held after its imports. Targets: 30 s and 2 GiB for 200 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

TARGET_S, TARGET_BYTES = 30.0, 2 << 30
FILLER_BYTES = 720  # about what one filler op, its launch and its kernel take in the file

READ = """
import json, resource, sys, time
from exonet.profile import read_profile
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
profile = read_profile(sys.argv[1])
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"read_s": seconds, "peak_bytes": (peak - before) * 1024, "step_s": profile.step_s,
                  "gradients": len(profile.backward_s), "device": profile.device}))
"""


def write_trace(path: str | Path, *, steps: int, forward_us: float, grads: Sequence[tuple[float, Sequence[int]]],
                tail_us: float, optimizer_us: float = 0.0, filler: int = 0, gpu: bool = False,
                modules: Sequence[tuple[str, float]] = ()) -> Path:
    """A Kineto Chrome-trace JSON of ``steps`` identical training steps, as ``export_chrome_trace`` writes.

    Each step: ``forward_us`` of forward, then for each ``(gap_us, shape)`` of ``grads`` a backward op of
    ``gap_us`` ending in an AccumulateGrad of a tensor of ``shape``, then ``tail_us`` (of which the first
    ``optimizer_us`` are ``Optimizer.step#SGD.step``). ``filler`` CPU ops per step are spread over the
    forward (with ``gpu``, each launches a kernel that runs for half its span); ``modules`` are ``(name, µs)``
    annotations laid one after another from the forward's start (``nn.Module: Linear_0``, ...).
    """
    path = Path(path)
    step_us = forward_us + sum(g for g, _ in grads) + tail_us
    corr = 0
    with path.open("w") as out:
        out.write('{"schemaVersion": 1, "deviceProperties": [%s], "traceEvents": [\n'
                  % ('{"id": 0, "name": "NVIDIA H100 80GB HBM3"}' if gpu else ""))
        first = True

        def put(event: dict[str, Any]) -> None:
            nonlocal first
            out.write(("" if first else ",\n") + json.dumps(event))
            first = False

        for s in range(steps):
            t0 = 1000.0 + s * step_us
            put({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": 1, "tid": 1, "ts": t0,
                 "dur": step_us, "args": {"External id": 1}})
            put({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0, "dur": forward_us,
                 "args": {"External id": 2, "Input Dims": [[8, 8], [8, 8]]}})
            at = t0
            for name, dur in modules:
                put({"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": at, "dur": dur,
                     "args": {"Python id": 1}})
                at += dur
            width = forward_us / max(filler, 1)
            for k in range(filler):
                corr += 1
                ts = t0 + k * width
                put({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": ts, "dur": width / 2,
                     "args": {"External id": corr, "Sequence number": corr, "Fwd thread id": 0,
                              "Input Dims": [[1024, 1024], [1024, 1024], []],
                              "Input type": ["float", "float", "Scalar"]}})
                if gpu:
                    put({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                         "dur": width / 8, "args": {"External id": corr, "correlation": corr}})
                    put({"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "pid": 0, "tid": 7,
                         "ts": ts + width / 8, "dur": width / 2,
                         "args": {"External id": corr, "correlation": corr, "device": 0, "stream": 7}})
            t = t0 + forward_us
            for gap, shape in grads:
                put({"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0",
                     "pid": 1, "tid": 2, "ts": t, "dur": gap, "args": {"Sequence number": 1, "Fwd thread id": 1}})
                t += gap
                put({"ph": "X", "cat": "cpu_op",
                     "name": "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
                     "pid": 1, "tid": 2, "ts": t, "dur": 0.0, "args": {"External id": 3}})
                put({"ph": "X", "cat": "cpu_op", "name": "torch::autograd::AccumulateGrad", "pid": 1, "tid": 2,
                     "ts": t, "dur": 0.0, "args": {"External id": 4, "Input Dims": [list(shape)]}})
            if optimizer_us:
                put({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1,
                     "ts": t, "dur": optimizer_us, "args": {"External id": 5}})
        out.write("\n]}\n")
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m exonet.bench profile", description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="size of the generated trace in MB (default 200)")
    parser.add_argument("--keep", help="write the trace here and keep it (default: a temporary file)")
    args = parser.parse_args(argv)
    steps = 6
    filler = max(1, int(args.mb * 1e6 / FILLER_BYTES / steps))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep or Path(tmp) / "trace.json")
        write_trace(path, steps=steps, forward_us=1e5, grads=[(100.0, [1024, 1024])] * 200, tail_us=1e3,
                    optimizer_us=500.0, filler=filler, gpu=True)
        size = path.stat().st_size
        done = subprocess.run([sys.executable, "-c", READ, str(path)], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    result.update(trace_bytes=size, ok=result["read_s"] <= TARGET_S and result["peak_bytes"] <= TARGET_BYTES)
    print(f"read a {size / 1e6:.0f} MB trace in {result['read_s']:.1f} s (target {TARGET_S:g} s), peak "
          f"{result['peak_bytes'] / 2**30:.2f} GiB above the imports (target {TARGET_BYTES / 2**30:g} GiB)")
    return result
