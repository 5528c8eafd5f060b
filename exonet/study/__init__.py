"""Studies a researcher runs on top of fit and simulate: strategies against scenarios, and what they show.

``comparison`` (``exonet.compare``: recorded runs replayed per scenario, one row each), ``quickstart``
(the main job: four strategies on three networks), ``projection`` (a small run's strategies at a stated
model size), ``timeline`` (a replay as a Gantt chart) and ``tokens`` (tokens trained and time per token).
"""
