"""Communicator: the only door from a strategy to torch.distributed.

Every call performs the real collective, counts the payload this rank passed in,
and appends the node's trace: the compute span since the last communication, then
the collective (and, for async calls, a Wait when the handle is waited on; an async
collective's end is the Wait, so its ``end_s`` stays None). That
is what makes byte counting, tracing and simulation automatic for every strategy.

Bookkeeping traffic (start-up broadcast, evaluation averaging, the final model)
goes through ``bookkeeping()``: the clock is paused, nothing is recorded or counted.

``blocking`` is the one hook for the runtime: every call that waits on other nodes runs
inside ``comm.blocking()``. The node passes its heartbeat's, so the progress watchdog
can tell a node that waits in a collective from the node that hangs (exonet.runtime.watchdog).
Under the online clock (exonet.runtime.clock) ``clock`` is the node's link to it: ``recv_any``
asks it who to receive from, and when it ``announces``, every blocking call first
reports the events so far (the call itself included, its ``end_s`` then None).

Modules: ``core`` (the state, how one call is run and traced, and the Handle of an async call),
``collectives`` (``Communicator`` and its collectives), ``messages`` (send, recv, put, get, recv_any),
``questions`` (what a strategy asks the simulated clock) and ``view`` (``GroupView``: the Communicator of a
strategy whose world is a group of the ranks, such as a pipeline stage's replicas).
"""

from exonet.communicator.collectives import Communicator
from exonet.communicator.core import REDUCE_OPS, ClockSide, CommCore, GroupArg, Handle
from exonet.communicator.questions import any_source_question

__all__ = ["REDUCE_OPS", "ClockSide", "CommCore", "Communicator", "GroupArg", "Handle", "any_source_question"]
