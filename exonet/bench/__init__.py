"""Benchmarks: ``python -m exonet.bench NAME`` runs ``exonet/bench/NAME.py``'s ``main(argv)``.

``runtime`` (exonet's DDP against a bare-torch floor), ``communicator`` (a traced all-reduce against a
raw one), ``scale`` (K processes: start-up, step time, memory per node), ``memory`` (an in-memory
dataset's summed PSS), ``strategies`` (every strategy's step; DeMo against a reference), ``netsim``
and ``simulator`` (the replay's events per second), ``failures`` (a replay under many failures),
``profile`` (reading a large torch.profiler trace), ``field`` (the field's methods estimated at their
scale) and ``fuzz`` (a new random search of the file readers). Modules starting with ``_`` are their helpers.
"""
