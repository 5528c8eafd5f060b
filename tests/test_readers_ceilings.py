"""Readers with ceilings (issue 42): a profile is a bounded regular file, and the CLI ends every error in one line."""

from __future__ import annotations

import errno
import json
import os
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from exonet import TraceError
from exonet.bench.profile import write_trace
from exonet.cli import build_parser, main
from exonet.files import atomic_file
from exonet.profile import read_profile
from exonet.profile.kineto import _compute_clock

MIB = 1 << 20


def _gzip_members(path: Path, member: bytes, times: int) -> Path:
    """A gzip file of ``times`` copies of one gzip member: gzip readers join members, so a small file holds a lot."""
    with path.open("wb") as f:
        for _ in range(times):
            f.write(member)
    return path


def _gzip_member(head: bytes, fill: bytes, size: int) -> bytes:
    """One gzip member of ``head`` then ``fill`` bytes up to ``size``, compressed chunk by chunk (streamed)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(head)]
    chunk = fill * (MIB // len(fill))
    for _ in range((size - len(head)) // len(chunk)):
        out.append(z.compress(chunk))
    return b"".join(out) + z.flush()


def _small_trace(path: Path) -> Path:
    return write_trace(path, steps=3, forward_us=1000.0, grads=[(500.0, (8, 8)), (500.0, (8,))], tail_us=200.0)


def test_a_gzip_bomb_of_zeros_is_refused_at_once_in_little_memory(tmp_path):
    """4 MB of gzip that expands to 4 GiB of zeros (the issue's MemoryError): refused by its first bytes."""
    bomb = _gzip_members(tmp_path / "bomb.json.gz", _gzip_member(b"", b"\0", 64 * MIB), 64)
    assert bomb.stat().st_size < 5 * MIB
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(TraceError, match=r"bomb\.json\.gz: not Kineto's Chrome-trace JSON: it begins b'\\x00"):
            read_profile(bomb)
        seconds, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < 5.0 and peak < 500 * MIB


def test_a_gzip_bomb_that_begins_like_json_is_refused_at_the_ceiling_without_holding_it(tmp_path):
    """The same trick behind a JSON start: counted in chunks up to the ceiling, never held whole."""
    bomb = _gzip_members(tmp_path / "blank.json.gz", _gzip_member(b'{"traceEvents": [', b" ", 16 * MIB), 4)
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=r"blank\.json\.gz: decompresses to more than the profile ceiling of "
                                             r"8,388,608 bytes; raise it .*--profile-max-size"):
            read_profile(bomb, max_bytes=8 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB


def test_only_a_regular_file_within_the_ceiling_is_read(tmp_path):
    start = time.perf_counter()
    with pytest.raises(TraceError, match=r"^/dev/zero: not a regular file"):
        read_profile("/dev/zero")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match=r"pipe\.json: not a regular file"):
        read_profile(fifo)  # opened without blocking: no writer is waited for
    assert time.perf_counter() - start < 1.0
    trace = _small_trace(tmp_path / "t.json")
    size = trace.stat().st_size
    with pytest.raises(TraceError, match=rf"t\.json: {size:,} bytes is more than the profile ceiling of 1,024 bytes"):
        read_profile(trace, max_bytes=1024)
    assert read_profile(trace).steps_used == 2
    plain = tmp_path / "plain.json.gz"
    plain.write_bytes(trace.read_bytes())
    with pytest.raises(TraceError, match=r"plain\.json\.gz: named \.gz but not gzip"):
        read_profile(plain)


def test_the_cli_refuses_dev_zero_at_once_and_a_flag_raises_the_ceiling(tmp_path, capsys):
    args = ["estimate", "--model", "torch.nn:Identity", "--strategy", "ddp", "--nodes", "2", "--steps", "2",
            "--scenario", "datacenter"]
    start = time.perf_counter()
    assert main(args + ["--profile", "/dev/zero"]) == 2
    assert time.perf_counter() - start < 5.0
    err = capsys.readouterr().err
    assert err == ("exonet estimate: error: /dev/zero: not a regular file: a profiler trace is a .json or .json.gz "
                   "file\n")
    trace = _small_trace(tmp_path / "t.json")
    assert main(args + ["--profile", str(trace), "--profile-max-size", "1 KiB"]) == 2
    assert "is more than the profile ceiling of 1,024 bytes" in capsys.readouterr().err
    parsed = build_parser().parse_args(args + ["--profile", str(trace), "--profile-max-size", "2 GiB"])
    assert parsed.profile_max_size == 2 << 30


@pytest.mark.parametrize("text, says", [
    ('{"traceEvents": [' + "[" * 200_000 + "]" * 200_000 + "]}", "nested too deeply"),
    ('{"events": []}', "expected an object with a 'traceEvents' list"),
    ("[1, 2]", "it begins b'[1, 2]', not '{'"),
    ("\0\0\0", "it begins"),
])
def test_a_malformed_profile_is_a_trace_error(tmp_path, text, says):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=r"bad\.json: ") as err:
        read_profile(path)
    assert says in str(err.value)


@pytest.mark.parametrize("field, value", [
    ("name", 5), ("name", ["x"]), ("cat", {"a": 1}), ("ts", "soon"), ("ts", 10**400), ("ts", [1]), ("dur", None),
    ("args", {"correlation": [1, 2], "Input Dims": {"a": 1}}), ("args", {"Input Dims": [["x", None]]}),
    ("args", {"correlation": {"a": 1}}), ("ph", 7),
])
def test_wrongly_typed_profile_fields_are_skipped_or_a_trace_error_never_a_traceback(tmp_path, field, value):
    path = _small_trace(tmp_path / "t.json")
    data = json.loads(path.read_text())
    for event in data["traceEvents"]:
        if event.get("ph") == "X":
            event[field] = value
    data["deviceProperties"] = 7
    path.write_text(json.dumps(data))
    try:
        read_profile(path)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}: ")


def test_compute_clock_is_linear_in_the_collectives_and_ops(tmp_path):
    """40,000 collectives interleaved with 40,000 ops (quadratic before: 1.6·10^9 pairs); and the same answer as
    the interval sums it replaces."""
    n = 40_000
    inside = [("comm", 10.0 * i, 10.0 * i + 6.0, None) for i in range(n)]
    inside += [("cpu", 10.0 * i + 2.0, 10.0 * i + 3.0, None) for i in range(n)]  # inside a collective: not busy
    inside += [("cpu", 10.0 * i + 5.0, 10.0 * i + 8.0, None) for i in range(n)]  # straddles its end: busy
    start = time.perf_counter()
    clock = _compute_clock(inside, 0.0, 10.0 * n)
    marks = [clock(t) for t in (0.0, 4.0, 5.0, 7.0, 10.0 * n)]
    assert time.perf_counter() - start < 5.0
    # each collective is blocked from its start to the straddling op's start: 5 of every 10 µs
    assert marks == [0.0, 0.0, 0.0, 2.0, 5.0 * n]
    small = _compute_clock(inside[:3] + inside[n:n + 3] + inside[2 * n:2 * n + 3], 0.0, 30.0)
    blocked = [(0.0, 5.0), (10.0, 15.0), (20.0, 25.0)]
    for t in (0.0, 1.0, 5.0, 9.5, 12.0, 15.0, 24.0, 30.0):
        assert small(t) == t - sum(min(b, t) - a for a, b in blocked if a < t)


def test_an_unwritable_chrome_trace_is_one_line_naming_the_path(tmp_path, capsys):
    from exonet import Trace

    t = Trace(num_nodes=2)
    for r in range(2):
        t.add_compute(r, 1.0)
        t.add_collective(r, "all_reduce", 1000)
        t.add_step(r)
    t.save(tmp_path / "trace.jsonl")
    assert main(["simulate", str(tmp_path / "trace.jsonl"), "--scenario", "datacenter",
                 "--chrome-trace", "/proc/x.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("exonet simulate: error: /proc/x.json: ") and err.count("\n") == 1
    assert ".tmp-" not in err  # the temporary file beside it is a name the user never gave


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be made")
def test_a_temporary_file_that_cannot_be_made_is_named_as_the_destination():
    """The temporary file is the first thing made: its error named "/proc/.x.json.tmp-…"; now the path given."""
    with pytest.raises(OSError) as info:
        with atomic_file("/proc/x.json") as f:
            f.write(b"{}")
    assert info.value.filename == "/proc/x.json" and str(info.value).endswith(": '/proc/x.json'")
    assert isinstance(info.value, FileNotFoundError) and "/proc/.x.json.tmp-" in str(info.value.__cause__.filename)


def test_a_failed_write_is_named_as_the_destination_and_leaves_nothing(tmp_path, monkeypatch):
    """A full disk names no file ("[Errno 28] No space left on device"): the error names the file given, and
    neither it nor a temporary file is left."""
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("exonet.files.os.fsync", full)
    with pytest.raises(OSError) as info:
        with atomic_file(tmp_path / "out.json") as f:
            f.write(b"{}")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error, says", [
    (OverflowError("int too large to convert to float"), "needs a number too large to compute with: int too large"),
    (RecursionError("maximum recursion depth exceeded"), "needs nesting too deep to follow"),
    (MemoryError(), "needs more memory than there is"),
    (OSError(28, "No space left on device", "/full/out.json"), "/full/out.json: No space left on device"),
])
def test_main_turns_the_last_errors_into_one_line_naming_the_input(monkeypatch, capsys, error, says):
    def fail(args):
        raise error

    monkeypatch.setattr("exonet.cli._cmd_scenarios", fail)
    assert main(["scenarios", "datacenter"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.startswith("exonet scenarios: error: ")
    if not isinstance(error, OSError):
        assert "(datacenter)" not in err and "the command line" in err  # scenarios' name is not an input file


def test_model_says_it_runs_code_and_a_missing_module_hints_at_the_import_path(capsys):
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["estimate"].format_help().split())
    assert "imports MOD and calls FN: it runs that code with your rights" in text
    assert main(["estimate", "--model", "no_such_module_x:build", "--strategy", "ddp", "--nodes", "2",
                 "--steps", "2", "--step-time", "1", "--scenario", "datacenter"]) == 2
    err = capsys.readouterr().err
    assert "No module named 'no_such_module_x'" in err and "python -m exonet" in err and "PYTHONPATH=." in err
