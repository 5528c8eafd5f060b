"""Ground truth for the simulator: real exonet nodes on kernel-shaped namespace links, compared and calibrated.

``netns`` builds the network (namespaces, bridges, tbf/ifb shaping, teardown),
``cases`` runs real nodes on it and simulates the same cases, ``calibrate`` fits the
model's free parameters on half the cases and reports the held-out error, ``runs`` turns a
recorded run's own collective timings into measurements, and ``slowlinks``/``streams`` time
rings over many TCP streams through shapers set up as real hosts are.
"""
