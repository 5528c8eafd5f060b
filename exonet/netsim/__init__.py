"""The network simulator: replay a Trace through exonet's model of links, collectives and compute.

``simulate(trace, scenario)`` returns a ``SimResult`` (``simulate([a, b], scenario, placement=...)``:
several jobs on one network); ``Simulation`` is the same replay fed event by event. Modules:
``topology`` (NICs, regions, hosts, paths), ``flows`` (fluid max-min / FIFO sharing),
``collectives`` (algorithms as phases and their closed forms), ``rings`` (ring orders and
mirrors), ``nccl`` and ``gloo`` (the libraries' own algorithms), ``tcp`` (Linux's windows and slow
start), ``compute`` (speed, jitter, slowdowns, outages), ``failures`` (failures drawn as a process),
``outages`` (when a collective's members are all up),
``fastpath`` (lone collectives timed without events), ``agenda`` (integer ticks, same-instant
order, on a SimPy event clock), ``state`` (the replay's records), ``simstate`` (the state the
replay's parts share), ``engine`` (the replay) with its mixins ``eventpath`` (phases as fluid
flows), ``handover`` (between the fast path and the event path), ``messages`` (when a point-to-point message goes:
gloo's rendezvous, a sender's release, any-source receives), ``queries`` (what the online clock
asks) and ``outcome`` (the result), ``replay`` (``simulate``, a whole trace or several jobs),
``memo`` (a step that repeats one replayed is played back),
``store`` (puts and gets as messages to a store rank),
``diagnose`` (why a replay cannot finish), ``result``, ``spread`` (the stochastic range),
``confidence`` (the range from the model's measured errors), ``spans`` (the kinds of a node's
time), ``chrome`` (the Chrome/Perfetto trace), ``progress`` (a long replay's bar); ``workers``
works a level above the replay (goodput of N chips in M workers under failures, at any chip count).
"""

from exonet.netsim.engine import Simulation
from exonet.netsim.replay import simulate
from exonet.netsim.result import CollectiveSpan, LinkLoad, NodeTimes, SimResult

__all__ = ["CollectiveSpan", "LinkLoad", "NodeTimes", "SimResult", "Simulation", "simulate"]
