"""Scenarios: the network and compute a trace is replayed in.

``scenario`` loads, edits, resolves and describes them (``Scenario``; ``describe`` holds what its
description prints, section by section); ``resolved`` holds
``Resolved``, the same made concrete for a node count, which is all the simulator reads, and
its records (hosts, links, events, failures); ``schema`` is what a
document may say, field by field, with its error messages, and ``lines`` finds the file:line of a
key for them; ``units`` parses and formats the
quantities ("100 Mbit/s", "4 MiB", "30 ms"). The presets themselves are TOML files in
``exonet.presets``.
"""

from exonet.scenario.resolved import EventSpec, FailureSpec, HostSpec, LinkSpec, Resolved
from exonet.scenario.scenario import Scenario, ScenarioLike, list_presets
from exonet.scenario.schema import ALGORITHMS, FAMILIES

__all__ = ["ALGORITHMS", "FAMILIES", "EventSpec", "FailureSpec", "HostSpec", "LinkSpec", "Resolved", "Scenario",
           "ScenarioLike", "list_presets"]
