"""Shared fixtures and settings for the tests (pytest loads this file; test files cannot import each other).

Hypothesis is deterministic here, so the suite passes or fails on the code alone, not on the day's draw:
every Hypothesis test draws from one seed, printed in pytest's header, ``FUZZ_SEED`` unless the environment
says otherwise. ``EXONET_FUZZ_SEED=N`` repeats the run that printed seed N; ``EXONET_FUZZ_SEED=random`` draws
a new seed (an opt-in random search; ``python -m exonet.bench fuzz`` is the bigger one). The examples
database (``.hypothesis/`` in the working directory) is kept: an example that failed here is replayed
first next time, before the seeded ones. The "exonet" settings profile, loaded by default, has no
per-example deadline (a deadline measures the machine, and pytest-timeout catches a hang); another
profile can be chosen with ``--hypothesis-profile`` or ``HYPOTHESIS_PROFILE``.

Tests that wait for another process (a signal reaching a fit, a child's exit, stray nodes going away) wait
for the event itself, up to one generous ceiling, ``CEILING_S``: a loaded 2-core machine may take seconds
where a quiet one takes milliseconds, and no test asserts how fast that is.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import hypothesis
import pytest
from hypothesis import is_hypothesis_test, settings

FUZZ_SEED = 0
CEILING_S = 120.0  # the longest a test waits for another process's event before it fails


def _fuzz_seed() -> int:
    """The seed of this run's Hypothesis tests: FUZZ_SEED, or EXONET_FUZZ_SEED's number, or a new one."""
    chosen = os.environ.get("EXONET_FUZZ_SEED", "").strip()
    if chosen == "random":
        return random.randrange(2**32)
    try:
        return int(chosen) if chosen else FUZZ_SEED
    except ValueError:
        raise pytest.UsageError(f"EXONET_FUZZ_SEED={chosen!r}: expected an integer or 'random'") from None


RUN_SEED = _fuzz_seed()
settings.register_profile("exonet", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "exonet"))


def pytest_report_header() -> str:
    return (f"hypothesis seed: {RUN_SEED} (EXONET_FUZZ_SEED={RUN_SEED} repeats it; EXONET_FUZZ_SEED=random "
            f"searches anew)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every Hypothesis test without a seed of its own draws from this run's seed.

    ``hypothesis.seed`` (like ``derandomize`` and ``--hypothesis-seed``) would also switch the examples database
    off, and a failure found here would not be replayed next time; so the seed goes where ``@seed`` puts it,
    which Hypothesis reads as the test starts, and the database stays on.
    """
    for item in items:
        test = getattr(item, "obj", None)
        if not is_hypothesis_test(test):
            continue
        if not hasattr(test, "_hypothesis_internal_use_seed"):
            raise pytest.UsageError(f"this Hypothesis ({hypothesis.__version__}) keeps a test's seed elsewhere: "
                                    "update tests/conftest.py's pytest_collection_modifyitems")
        if test._hypothesis_internal_use_seed is None:
            test._hypothesis_internal_use_seed = RUN_SEED


def _node_pids() -> list[int]:
    """Live children of the forkserver that starts nodes (every node is one).

    Other children of the test process (a wandb service, a subprocess of another test) are not nodes.
    """
    from multiprocessing import forkserver

    parents = {getattr(forkserver._forkserver, "_forkserver_pid", None)} - {None}
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) in parents and fields.get("State", "").strip()[:1] != "Z":
            if b"resource_tracker" not in cmdline and b"forkserver" not in cmdline:
                pids.append(int(status.parent.name))
    return pids


@pytest.fixture
def node_pids() -> Callable[[], list[int]]:
    """A function listing node processes left running (it should return [] after every fit)."""
    return _node_pids


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("PPid:"))
        except (OSError, StopIteration):
            continue
        children.setdefault(ppid, []).append(int(status.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "Z" not in state.split()[1]


def _left_running(pids: set[int], within_s: float = CEILING_S) -> list[int]:
    """Those of ``pids`` still running (not zombies) once all have ended or ``within_s`` has passed (a process
    that is going away may take seconds to on a loaded machine; one left behind fails the test at the ceiling)."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(pid for pid in pids if _alive(pid))


@pytest.fixture
def descendants() -> Callable[[int], set[int]]:
    """A function giving every process below a pid: its children, theirs, and so on (from /proc)."""
    return _descendants


@pytest.fixture
def left_running() -> Callable[..., list[int]]:
    """A function giving those of a set of pids still running once they end or CEILING_S passes (it should return
    [])."""
    return _left_running


def _default_sighup() -> None:
    """The fit's SIGHUP at its default action, as a terminal's process has it: a suite run under ``nohup`` would
    pass SIGHUP on ignored, and a fit honours that (exonet.runtime.signals), so the SIGHUP test would wait in vain."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture
def running_fit(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """tests/interrupt_fit.py (a fit that runs until stopped) in a subprocess, once training is under way (its
    first checkpoint committed): the process and its run directory. Killed after the test if still running, with
    everything it started: it runs in a session of its own, and the whole process group is killed, since a node
    the test left behind would hold the fit's output pipes open and hang the teardown's read of them."""
    script = Path(__file__).with_name("interrupt_fit.py")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_default_sighup)
    try:
        deadline = time.monotonic() + CEILING_S
        while not list(tmp_path.glob("*/checkpoints/latest.json")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "training never got under way"
            time.sleep(0.1)
        (run,) = tmp_path.iterdir()
        yield proc, run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the fit (if still running), its forkserver and its nodes
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=CEILING_S)


@pytest.fixture
def ceiling_s() -> float:
    """How long a test waits for another process's event (its exit, a file it writes) before it fails."""
    return CEILING_S


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[tuple[str, object]]:
    """A moto S3 server on loopback for one test module, with the AWS environment pointing at it (node processes
    inherit it, as they would reach a real endpoint): its endpoint URL and a boto3 client on it."""
    import logging

    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with pytest.MonkeyPatch.context() as env:
            for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
                env.setenv(key, value)
            for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
                env.delenv(key, raising=False)
            yield f"http://{host}:{port}", boto3.client("s3")
    finally:
        server.stop()
