"""A long replay shows a progress bar (issue 42 §3); a short one, and any replay in a test, prints nothing.

The bar waits ``DELAY_S`` (2 s) of wall-clock time before it draws and looks at the clock every ``EVERY`` slots;
the tests shrink both so that a replay of milliseconds is "long", and read what reaches stderr.
"""

from __future__ import annotations

import functools
import io
import re

import pytest
import tqdm.std

import exonet.netsim.progress as progress
from exonet import Trace
from exonet.netsim import simulate

SCENARIO = {"name": "bar-test", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"}}
STEPS = 200


def _trace() -> Trace:
    """Two ranks of unequal speed, one all-reduce per step: STEPS slots of the agenda, 4 events a step per rank."""
    t = Trace(num_nodes=2)
    for _ in range(STEPS):
        for r in range(2):
            t.add_compute(r, 0.01 * (1 + r))
            t.add_collective(r, "all_reduce", 1_000_000)
            t.add_step(r)
    return t


@pytest.fixture
def at_once(monkeypatch):
    """Every replay counts as long: the bar may draw from the first slot on, and draws every move (tqdm's own
    limit of one draw per 0.1 s would hide a replay of milliseconds)."""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "EVERY", 1)
    monkeypatch.setattr("tqdm.auto.tqdm", functools.partial(tqdm.std.tqdm, mininterval=0.0, miniters=1))


def _counts(err: str) -> list[tuple[int, int]]:
    """Every (replayed, total) the bar drew."""
    return [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) \[", err)]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_true_draws_a_bar_on_stderr_and_changes_nothing(at_once, capsys):
    plain = simulate(_trace(), SCENARIO, progress=False)
    assert capsys.readouterr().err == ""
    shown = simulate(_trace(), SCENARIO, progress=True)
    err = capsys.readouterr().err
    assert err.startswith("\rsimulate bar-test: ") and " events/s]" in err
    counts = _counts(err)  # 2 ranks x 200 steps x 3 events, counted as they are replayed, all when it closes
    assert len(counts) > 10 and [c for c, _ in counts] == sorted(c for c, _ in counts) and counts[-1] == (1200, 1200)
    assert {total for _, total in counts} == {1200}
    assert (shown.wall_clock_s, shown.step_end_times) == (plain.wall_clock_s, plain.step_end_times)


def test_the_default_draws_only_on_a_terminal(at_once, capsys, monkeypatch):
    """Under pytest stderr is captured, not a terminal: the default (None) prints nothing however long the replay."""
    simulate(_trace(), SCENARIO)
    assert capsys.readouterr().err == ""
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    simulate(_trace(), SCENARIO)
    assert "simulate bar-test:" in terminal.getvalue()


def test_a_short_replay_draws_nothing_even_when_asked(capsys):
    """At the real DELAY_S a replay of milliseconds ends before the bar would draw."""
    simulate(_trace(), SCENARIO, progress=True)
    assert capsys.readouterr().err == ""


def test_several_jobs_count_in_one_bar(at_once, capsys):
    simulate([_trace(), _trace()], SCENARIO, progress=True)
    assert _counts(capsys.readouterr().err)[-1] == (2400, 2400)


def test_progress_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match=r"simulate: progress must be True, False or None .*got 'yes'"):
        simulate(_trace(), SCENARIO, progress="yes")  # type: ignore[arg-type]
