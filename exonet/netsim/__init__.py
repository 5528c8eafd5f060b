"""The network simulator: replay a Trace through exonet's model of links, collectives and compute.

``simulate(trace, scenario)`` returns a ``SimResult`` (``simulate([a, b], scenario, placement=...)``:
several jobs on one network); ``Simulation`` is the same replay fed event by event. Modules:
``topology`` (NICs, regions, hosts, paths), ``flows`` (fluid max-min / FIFO sharing),
``collectives`` (algorithms as phases and their closed forms), ``compute`` (speed, jitter,
slowdowns, outages), ``failures`` (failures drawn as a process), ``fastpath`` (lone collectives
timed without events), ``agenda`` (integer ticks, same-instant order, on a SimPy event clock),
``state`` (the replay's records), ``engine`` (the replay), ``replay`` (``simulate``, a whole trace
or several jobs), ``diagnose`` (why a replay cannot finish), ``result``, ``spans`` (the kinds of a
node's time), ``chrome`` (the Chrome/Perfetto trace); ``learners`` works a level above the replay
(goodput of N chips in M learners under failures, at any chip count).
"""

from exonet.netsim.engine import Simulation
from exonet.netsim.replay import simulate
from exonet.netsim.result import CollectiveSpan, LinkLoad, NodeTimes, SimResult

__all__ = ["CollectiveSpan", "LinkLoad", "NodeTimes", "SimResult", "Simulation", "simulate"]
