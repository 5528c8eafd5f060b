"""How the parent of a local run treats signals: SIGTERM and SIGHUP save like Ctrl-C, and no start is torn.

Ctrl-C raises KeyboardInterrupt, and the run's ``finally`` stops every node and saves what it
has. SIGTERM (``docker stop``, ``timeout``, a batch preemption) and SIGHUP (a closed terminal)
would kill the process outright, losing the run; during a fit they raise ``Stopped`` instead,
the run saves as for Ctrl-C, and then the signal is delivered again with its old handler, so the
process ends as it would have (killed by that signal). Only signals left at their default action
are taken over (``nohup`` sets SIGHUP to be ignored, and a handler of the user's own already
raises into the run), and only in the main thread, where Python runs signal handlers.

``deferred()`` holds these signals for a block that must not be cut in half (a node's start
from the forkserver, the saving of an interrupted run, a lazy import): one that arrives is
delivered when the block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Any, Iterator, Mapping

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived during a fit (a BaseException, as KeyboardInterrupt is: not an error of the run).

    Attributes:
        signum: the signal.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} stopped the fit")
        self.signum = signum


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP raise ``Stopped``; leaving it by one re-delivers the signal.

    The block's own ``finally`` (saving the run) runs first; the signal is then raised again under
    the handler it had before the block (the default: the process ends, killed by it).
    """
    if not _in_main_thread():
        yield
        return
    taken = {s: signal.getsignal(s) for s in STOP_SIGNALS if signal.getsignal(s) is signal.SIG_DFL}
    for s in taken:
        signal.signal(s, _raise_stopped)
    try:
        yield
    except Stopped as stop:
        _restore(taken)
        signal.raise_signal(stop.signum)  # the default action: the process ends, killed by the signal
        raise
    finally:
        _restore(taken)


def _restore(handlers: Mapping[signal.Signals, Any]) -> None:
    for s, handler in handlers.items():
        signal.signal(s, handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then deliver the first that came.

    In a thread other than the main one this does nothing: no signal handler runs there.
    """
    if not _in_main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    watched = (signal.SIGINT, *STOP_SIGNALS)
    before = {s: signal.getsignal(s) for s in watched}
    held = {s: h for s, h in before.items() if h is not signal.SIG_IGN and h is not None}
    for s in held:
        signal.signal(s, hold)
    try:
        yield
    finally:
        _restore(held)
        if caught:
            signal.raise_signal(caught[0])
