"""The network simulator: replay a Trace through a SimPy model of links, collectives and compute.

``simulate(trace, scenario)`` returns a ``SimResult`` (``simulate([a, b], scenario, placement=...)``:
several jobs on one network); ``Simulation`` is the same
replay fed event by event. Modules: ``topology`` (NICs, regions, hosts, paths),
``flows`` (fluid max-min / FIFO sharing), ``collectives`` (algorithms as phases and
their closed forms), ``compute`` (speed, jitter, slowdowns, outages), ``fastpath``
(lone collectives timed without events), ``agenda`` (integer ticks, same-instant
order), ``state`` (the replay's records), ``engine`` (the SimPy replay), ``replay``
(``simulate``, a whole trace or several jobs), ``diagnose`` (why a replay cannot finish), ``result``,
``chrome`` (the Chrome/Perfetto trace).
"""

from exonet.netsim.engine import Simulation
from exonet.netsim.replay import simulate
from exonet.netsim.result import CollectiveSpan, LinkLoad, NodeTimes, SimResult

__all__ = ["CollectiveSpan", "LinkLoad", "NodeTimes", "SimResult", "Simulation", "simulate"]
