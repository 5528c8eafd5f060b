"""Ground truth for the simulator: real exonet nodes on kernel-shaped namespace links, compared and calibrated.

``netns`` builds the network (namespaces, bridges, tbf/ifb shaping, teardown),
``cases`` runs real nodes on it and simulates the same cases, ``calibrate`` fits the
model's free parameters on half the cases and reports the held-out error.
"""
