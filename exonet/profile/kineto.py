"""Read a torch.profiler trace (Kineto's Chrome-trace JSON) into one training step's measured compute.

The file is what ``prof.export_chrome_trace(path)`` or ``tensorboard_trace_handler`` writes (``.json``
or ``.json.gz``): ``{"traceEvents": [{"ph": "X", "name": ..., "ts": µs, "dur": µs, "args": {...}}, ...]}``.
What a step is made of comes from names the profiler itself writes:

* ``ProfilerStep#N``: one step (written when the profiler has a ``schedule``, as ``prof.step()`` advances it);
* ``autograd::engine::evaluate_function: ...``: backward; the first one in a step ends the forward pass;
* ``autograd::engine::evaluate_function: torch::autograd::AccumulateGrad``: a parameter's gradient is ready
  (one per trainable tensor per step; with ``record_shapes=True`` its inner ``torch::autograd::AccumulateGrad``
  op carries the tensor's shape);
* ``Optimizer.step#...``: the optimizer step;
* ``nn.Module: Name_i`` (``with_stack=True, with_modules=True``) and ``record_function`` annotations:
  forward time per module;
* GPU kernels (``cat`` ``kernel``/``gpu_memcpy``/``gpu_memset``) and their launches (``cuda_runtime``) share a
  ``correlation`` id: on a GPU trace a gradient is ready when the last kernel launched before its
  AccumulateGrad ends, and the device is idle where no kernel runs;
* collectives (``c10d::allreduce_`` where the node issues or waits on one, the backend's ``gloo:all_reduce``,
  ``nccl:...``, NCCL kernels, and ``exonet::<call>`` around each call a ``fit(profile=True)`` node blocks
  in): a step profiled inside a distributed run waits on them; time when one runs and no op outside a
  collective does is exposed communication, left out of the step (``comm_s``), since the simulator times
  its own;
* ``exonet_step_compute`` (top level, written by ``fit(profile=True)``): the traced compute of steps run
  without the profiler and with it. The first's median is the step's compute (the profile gives only how it
  splits), so neither the profiler's overhead (their ratio) nor a wait the profile counts as compute is in it.

The file is parsed with an ``object_hook`` that keeps only these few fields of each event, so a trace of
hundreds of MB costs a fraction of what its whole event dicts would (``python -m exonet.bench profile``).
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import math
import os
import stat
import statistics
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from exonet.errors import TraceError

STEP = "ProfilerStep#"
MIN_STEPS = 5  # profiled steps after the warm-up one, for a median that holds
MAX_SPREAD = 0.2  # (slowest − fastest) ÷ median beyond which the profile is warned about
BACKWARD = "autograd::engine::evaluate_function: "
GRAD_READY = BACKWARD + "torch::autograd::AccumulateGrad"
GRAD_OP = "torch::autograd::AccumulateGrad"
OPTIMIZER = "Optimizer.step#"
MODULE = "nn.Module: "
KERNELS = ("kernel", "gpu_memcpy", "gpu_memset")
BLOCKED = "exonet::"  # fit(profile=True): a call the node blocked in, as its trace counts it (exonet.profile.record)
COLLECTIVES = ("c10d::", "gloo:", "nccl:", "ncclDevKernel", "ncclKernel", BLOCKED)  # a collective's issue, wait, run
STEP_COMPUTE = "exonet_step_compute"  # fit(profile=True): traced compute of unprofiled and profiled steps
LAUNCHES = ("cuda_runtime", "cuda_driver")
NOT_MODULES = (STEP, "Optimizer.", "PyTorch Profiler")  # annotations the profiler writes itself
# The largest trace read, on disk and decompressed: 1 GiB, five times the 198 MB of `python -m exonet.bench profile`
# (0.5 GiB of memory above the imports to read); a larger genuine trace raises it.
MAX_BYTES = 1 << 30
CEILING_FLAG = "--profile-max-size"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class StepProfile:
    """One training step as a profiler measured it (medians over the steps used), in seconds.

    ``forward_s`` runs from the step's start to its first backward op (data, forward, loss);
    ``backward_s[i]`` is the backward compute before the i-th gradient to become ready (so the
    i-th gradient is ready ``forward_s + sum(backward_s[:i+1])`` into the step); ``tail_s`` runs from
    the last gradient to the step's end (the optimizer step, ``zero_grad``, logging). The three add up
    to ``step_s``: the median ``ProfilerStep`` less its exposed communication ``comm_s`` or, in a profile from
    ``fit(profile=True)``, the median traced compute of its unprofiled steps (each median part is scaled by
    the same factor so they add up).
    """

    path: str
    step_s: float
    forward_s: float
    backward_s: tuple[float, ...]
    grad_shapes: tuple[tuple[int, ...] | None, ...]
    tail_s: float
    optimizer_s: float
    idle_s: float
    comm_s: float
    modules: dict[str, float]
    steps_used: int
    warmup_dropped: bool
    device: str
    notes: list[str] = field(default_factory=list)
    spread: float = 0.0  # (slowest − fastest) ÷ median of the steps used: how far one step is from another
    overhead: float | None = None  # the profiler's share of each profiled part, measured and taken out (None: unknown)


def _slim(d: dict) -> Any:
    """``json.loads``'s object_hook: each event becomes a small tuple (or None), its args the two fields used."""
    ph = d.get("ph")
    if ph is None:
        if "traceEvents" in d:
            return d
        if "External id" in d or "correlation" in d or "Input Dims" in d:
            dims, corr = d.get("Input Dims"), d.get("correlation")
            return (corr if _is_int(corr) else None, _shape(dims[0]) if isinstance(dims, list) and dims else None)
        return d
    if ph != "X":
        return None
    name, cat, args = d.get("name", ""), d.get("cat", ""), d.get("args")
    if not isinstance(name, str) or not isinstance(cat, str):
        return None  # (a wrongly typed event is not one the profiler wrote: skipped, as an unknown one is)
    try:
        ts, end = float(d["ts"]), float(d["ts"]) + float(d.get("dur", 0.0))
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(end) or end < ts:
        return None
    kind = _kind(name, cat)
    if kind is None:
        return None
    if kind in ("comm", "cpu"):
        extra = d.get("tid")
    elif kind in ("kernel", "launch", "shape"):
        extra = (args[0] if kind != "shape" else args[1]) if isinstance(args, tuple) else None
    else:
        extra = name.removeprefix(MODULE) if kind in ("module", "step") else None
    return (kind, ts, end, extra)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape(dims: object) -> tuple[int, ...] | None:
    """A tensor's shape from ``Input Dims``: a list of integers, else None."""
    return tuple(dims) if isinstance(dims, list) and all(_is_int(x) for x in dims) else None  # type: ignore[arg-type]


def _kind(name: str, cat: str) -> str | None:
    """What an event of this name and category is to a step (None: nothing)."""
    if name.startswith(COLLECTIVES):
        return "comm"
    if cat in KERNELS or cat in LAUNCHES:
        return "kernel" if cat in KERNELS else "launch"
    if name.startswith(BACKWARD):
        return "grad" if name == GRAD_READY else "backward"
    for prefix, kind in ((GRAD_OP, "shape"), (STEP, "step"), (OPTIMIZER, "optimizer"), (MODULE, "module")):
        if name.startswith(prefix):
            return kind
    if cat == "user_annotation" and not name.startswith(NOT_MODULES):
        return "module"
    return "cpu" if cat == "cpu_op" else None


def _load(path: Path, max_bytes: int) -> dict:
    """The trace's JSON with slimmed events (gzip when its first bytes say so), read within ``max_bytes``."""
    raw = _read(path, max_bytes)
    try:
        data = json.loads(raw, object_hook=_slim)
    except RecursionError:
        raise TraceError(f"{path}: not Kineto's Chrome-trace JSON: nested too deeply (a trace's events are objects "
                         "in one list)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not Kineto's Chrome-trace JSON (torch.profiler's export_chrome_trace): "
                         f"{exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: not Kineto's Chrome-trace JSON: expected an object with a 'traceEvents' list "
                         "(as torch.profiler's export_chrome_trace writes)")
    return data


def _read(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, decompressed if gzip: a regular file, at most ``max_bytes`` on disk and decompressed, that
    begins as JSON does. Opened without blocking, so a FIFO or a device is refused at once, not read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the profiler trace: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd)
        if not stat.S_ISREG(size.st_mode):
            raise TraceError(f"{path}: not a regular file: a profiler trace is a .json or .json.gz file")
        if size.st_size > max_bytes:
            raise TraceError(f"{path}: {size.st_size:,} bytes is more than the profile ceiling of {max_bytes:,} "
                             f"bytes; raise it if the trace is genuine ({CEILING_FLAG} in the CLI, max_bytes=)")
        try:
            if f.read(2) == GZIP_MAGIC:
                return _gunzip(path, f, max_bytes)
            if path.suffix == ".gz":
                raise TraceError(f"{path}: named .gz but not gzip (its first bytes are not 1f 8b)")
            f.seek(0)
            raw = f.read(size.st_size + 1)
        except OSError as exc:
            raise TraceError(f"{path}: cannot read the profiler trace: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise TraceError(f"{path}: grew past the profile ceiling of {max_bytes:,} bytes while read")
    _check_start(path, raw[:64])
    return raw


def _gunzip(path: Path, f: BinaryIO, max_bytes: int) -> bytes:
    """A gzip file's contents, refused once they pass ``max_bytes``: a first pass counts them in chunks (a bomb
    costs time to the ceiling, not memory), a second reads what it counted."""
    total = 0
    try:
        f.seek(0)
        with gzip.GzipFile(fileobj=f) as z:
            while chunk := z.read(1 << 20):
                if not total:
                    _check_start(path, chunk[:64])
                total += len(chunk)
                if total > max_bytes:
                    raise TraceError(f"{path}: decompresses to more than the profile ceiling of {max_bytes:,} bytes; "
                                     f"raise it if the trace is genuine ({CEILING_FLAG} in the CLI, max_bytes=)")
        f.seek(0)
        with gzip.GzipFile(fileobj=f) as z:
            raw = z.read(total + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: not a readable gzip file: {exc}") from None
    if len(raw) != total:
        raise TraceError(f"{path}: changed while read")
    return raw


def _check_start(path: Path, head: bytes) -> None:
    """TraceError unless ``head``, the first bytes, could begin a JSON object (blank: cannot tell yet)."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if text and not text.startswith(b"{"):
        raise TraceError(f"{path}: not Kineto's Chrome-trace JSON: it begins {head[:16]!r}, not '{{' (as "
                         "torch.profiler's export_chrome_trace writes)")


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class _DeviceClock:
    """When work the CPU launched by time t is done on the GPU: the end of the last kernel launched by then.

    A CPU trace has no kernels: its times are the device's own.
    """

    def __init__(self, events: list[tuple]) -> None:
        kernels = {e[3]: e[2] for e in events if e[0] == "kernel" and e[3] is not None}
        launches = sorted((e[1], kernels[e[3]]) for e in events if e[0] == "launch" and e[3] in kernels)
        self.launch_ts = [t for t, _ in launches]
        self.done, reach = [], float("-inf")
        for _, end in launches:
            reach = max(reach, end)
            self.done.append(reach)
        self.gpu = bool(kernels)

    def __call__(self, t: float) -> float:
        i = bisect.bisect_right(self.launch_ts, t)
        return self.done[i - 1] if self.gpu and i else t


def read_profile(path: str | Path, max_bytes: int = MAX_BYTES) -> StepProfile:
    """A profiler trace's training step: medians over its ``ProfilerStep`` spans, the first dropped as warm-up.

    Args:
        path: the trace, ``.json`` or gzip (``.json.gz``): a regular file.
        max_bytes: the largest trace read, on disk and decompressed (``MAX_BYTES``, 1 GiB, by default).

    Raises:
        TraceError: the file is not a regular file, is larger than ``max_bytes``, is not Kineto JSON, has fields
            of the wrong type, has no ``ProfilerStep`` span, or a step has no backward (naming the file and what).
    """
    path = Path(path)
    data = _load(path, max_bytes)
    try:
        return _step_profile(path, data)
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        raise TraceError(f"{path}: not Kineto's Chrome-trace JSON: a field has an unexpected type or value "
                         f"({type(exc).__name__}: {exc})") from None


def _step_profile(path: Path, data: dict) -> StepProfile:
    """``read_profile`` of the parsed ``data``."""
    events = [e for e in data["traceEvents"] if isinstance(e, tuple)]
    steps = sorted((e for e in events if e[0] == "step"), key=lambda e: e[1])
    if not steps:
        raise TraceError(f"{path}: no ProfilerStep span: profile with a schedule (torch.profiler.profile("
                         "schedule=torch.profiler.schedule(wait=0, warmup=1, active=5)) and call prof.step() "
                         "after every training step")
    notes, dropped = [], len(steps) > 1
    if dropped:
        notes.append(f"{len(steps) - 1} profiled steps (the first of {len(steps)}, {steps[0][3]}, dropped as "
                     "warm-up), medians")
        steps = steps[1:]
    else:
        notes.append(f"one profiled step ({steps[0][3]}): nothing to drop as warm-up; profile 2 or more")
    clock = _DeviceClock(events)
    starts = [s[1] for s in steps]
    per_step: list[list[tuple]] = [[] for _ in steps]
    for e in events:
        i = bisect.bisect_right(starts, e[1]) - 1
        if i >= 0 and e[1] < steps[i][2] and e[0] != "step":
            per_step[i].append(e)
    parts = [_split(path, step, inside, clock) for step, inside in zip(steps, per_step)]
    counts = {len(p["backward"]) for p in parts}
    if len(counts) > 1:
        raise TraceError(f"{path}: the profiled steps differ in their gradients (AccumulateGrad ops: "
                         f"{sorted(counts)}): profile steps of one model, all training")
    med = statistics.median
    step_s = med(p["span"] for p in parts)
    spread = _check_steps(path, [p["span"] for p in parts], step_s, notes)
    forward, tail = med(p["forward"] for p in parts), med(p["tail"] for p in parts)
    backward = [med(p["backward"][i] for p in parts) for i in range(counts.pop())]
    traced = _traced_step(data.get(STEP_COMPUTE), notes)
    overhead = None if traced is None else traced[1]
    if traced is not None:
        step_s = traced[0]
    scale = step_s / max(forward + sum(backward) + tail, 1e-300)
    comm = med(p["comm"] for p in parts)
    if comm > 0:
        notes.append(f"{comm * 1e3:.3g} ms per step of exposed communication (gloo/NCCL) left out: the simulator "
                     "times its own")
    names = {n for p in parts for n in p["modules"]}
    props = data.get("deviceProperties")
    device = next((d["name"] for d in (props if isinstance(props, list) else [])
                   if isinstance(d, dict) and isinstance(d.get("name"), str)), "GPU") if clock.gpu else "CPU"
    return StepProfile(
        path=str(path), step_s=step_s, forward_s=forward * scale, backward_s=tuple(b * scale for b in backward),
        grad_shapes=parts[0]["shapes"], tail_s=tail * scale,
        optimizer_s=med(p["optimizer"] for p in parts) * (1 - (overhead or 0.0)),  # as profiled, less the overhead
        idle_s=med(p["idle"] for p in parts), comm_s=comm,
        modules={n: med(p["modules"].get(n, 0.0) for p in parts) * (1 - (overhead or 0.0)) for n in names},
        steps_used=len(steps), warmup_dropped=dropped, device=device,
        notes=notes, spread=spread, overhead=overhead)


def _traced_step(stamp: object, notes: list[str]) -> tuple[float, float] | None:
    """The step's compute as the run's own trace measured it without the profiler, and the profiler's overhead
    (its share of a profiled step's traced compute), from ``exonet_step_compute``; None, and a note saying
    so, where the profile has no steps run unprofiled."""
    plain = stamp.get("unprofiled_s") if isinstance(stamp, dict) else None
    profiled = stamp.get("profiled_s") if isinstance(stamp, dict) else None
    if not (_durations(plain) and _durations(profiled)):
        notes.append("the profiler's own overhead is in these figures: no step ran unprofiled to measure it against "
                     "(fit(profile=True) leaves the first quarter of a run of 8 or more steps unprofiled)")
        return None
    base, slowed = statistics.median(plain), statistics.median(profiled)
    notes.append(f"the step's compute is the median traced compute of {len(plain)} steps run without the profiler, "
                 f"{base * 1e3:.3g} ms, split as the profile splits it: the profiler's own overhead "
                 f"({len(profiled)} profiled steps traced {slowed * 1e3:.3g} ms, {slowed / base - 1:+.0%}) and "
                 "any wait the profile cannot tell from compute are left out")
    return base, max(0.0, 1 - base / slowed)


def _durations(values: object) -> TypeGuard[list[float]]:
    """A non-empty list of finite, positive seconds."""
    return isinstance(values, list) and bool(values) and all(
        isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def _check_steps(path: Path, spans: list[float], median: float, notes: list[str]) -> float:
    """The steps' spread, (slowest − fastest) ÷ median; a note and a warning where there are too few steps for a
    median to hold (``MIN_STEPS`` after the warm-up) or they spread more than ``MAX_SPREAD``."""
    spread = (max(spans) - min(spans)) / median if median > 0 else 0.0
    if len(spans) < MIN_STEPS:
        notes.append(f"only {len(spans)} profiled step{'s' if len(spans) > 1 else ''} after the warm-up: profile "
                     f"{MIN_STEPS} or more for a median that holds")
    if spread > MAX_SPREAD:
        text = (f"the {len(spans)} profiled steps spread {spread:.0%} around their median ({min(spans) * 1e3:.3g} to "
                f"{max(spans) * 1e3:.3g} ms): the step replayed is their median; profile more steps, or on a quieter "
                "machine")
        notes.append(text)
        warnings.warn(f"{path}: {text}", stacklevel=4)  # the caller of read_profile
    return spread


def _split(path: Path, step: tuple, inside: list[tuple], clock: _DeviceClock) -> dict:
    """One step's parts in seconds: forward, backward before each gradient, tail, optimizer, idle, modules."""
    start, end = step[1], step[2]
    grads = sorted(e[2] for e in inside if e[0] == "grad")
    first_backward = min((e[1] for e in inside if e[0] in ("backward", "grad")), default=None)
    if not grads or first_backward is None:
        raise TraceError(f"{path}: {step[3]} has no backward (no AccumulateGrad op): profile training steps "
                         "(loss.backward() inside the step)")
    marks, last = [], start
    for t in [first_backward, *grads]:
        last = min(max(last, clock(t)), end)
        marks.append(last)
    compute = _compute_clock(inside, start, end)
    marks, span = [compute(m) for m in marks], compute(end) - compute(start)
    busy = [(max(e[1], start), min(e[2], end)) for e in inside if e[0] == ("kernel" if clock.gpu else "cpu")]
    modules: dict[str, float] = {}
    for e in inside:
        if e[0] == "module":
            modules[e[3]] = modules.get(e[3], 0.0) + (e[2] - e[1]) * 1e-6
    return {
        "span": span * 1e-6,
        "comm": (end - start - span) * 1e-6,
        "forward": (marks[0] - compute(start)) * 1e-6,
        "backward": [(b - a) * 1e-6 for a, b in zip(marks, marks[1:])],
        "tail": (compute(end) - marks[-1]) * 1e-6,
        "optimizer": sum(e[2] - e[1] for e in inside if e[0] == "optimizer") * 1e-6,
        "idle": (end - start - _union(busy)) * 1e-6,
        "modules": modules,
        "shapes": tuple(e[3] for e in sorted((e for e in inside if e[0] == "shape"), key=lambda e: e[2]))
        if sum(e[0] == "shape" for e in inside) == len(grads) else (None,) * len(grads),
    }


def _compute_clock(inside: list[tuple], start: float, end: float) -> Any:
    """Time with exposed communication taken out: t → t less the blocked time before it.

    Blocked: a collective runs (issued or waited on, on the backend's threads, as NCCL kernels) and no op
    outside a collective does.
    """
    comm = _merged([(max(e[1], start), min(e[2], end)) for e in inside if e[0] == "comm"])
    if not comm:
        return lambda t: t
    starts = [a for a, _ in comm]

    def within(e: tuple) -> bool:
        i = bisect.bisect_right(starts, e[1]) - 1
        return i >= 0 and e[2] <= comm[i][1]

    busy = _merged([(e[1], e[2]) for e in inside if e[0] in ("kernel", "cpu") and not within(e)])
    blocked, j = [], 0
    for a, b in comm:  # both sorted and disjoint: one pass over each (a busy span may reach into the next comm)
        while j < len(busy) and busy[j][1] <= a:
            j += 1
        k = j
        while k < len(busy) and busy[k][0] < b:
            x, y = busy[k]
            if x > a:
                blocked.append((a, x))
            a, k = max(a, y), k + 1
        if a < b:
            blocked.append((a, b))
    begins = [a for a, _ in blocked]
    before = list(itertools.accumulate((b - a for a, b in blocked), initial=0.0))  # blocked time before each

    def clock(t: float) -> float:
        i = bisect.bisect_left(begins, t)  # the blocked spans that begin before t, all but the last ended by then
        return t if i == 0 else t - before[i - 1] - (min(blocked[i - 1][1], t) - begins[i - 1])

    return clock


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering the same time."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
