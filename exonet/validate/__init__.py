"""Ground truth for the simulator: real exonet nodes on kernel-shaped namespace links, compared and calibrated.

``netns`` builds the network (namespaces, bridges, tbf/ifb shaping, teardown),
``cases`` runs real nodes on it and simulates the same cases, ``calibrate`` fits the
model's free parameters on half the cases and reports the held-out error, ``runs`` turns a
recorded run's own collective timings into measurements, ``slowlinks``/``streams`` time
rings over many TCP streams through shapers set up as real hosts are, ``buckets`` times DDP's
concurrent buckets on such links, ``delayline`` (a user-space delay line on TUN devices) and
``windows`` (TCP windows and slow start through it) judge the backend models under real delay,
``stages`` times a pipeline's stage boundary through it (micro-batches' messages, GPipe and 1F1B),
``residuals`` turns every recorded case into the model's error per regime, ``published`` replays
the papers' own timing models as traces, and ``command`` is ``exonet validate``.
"""
