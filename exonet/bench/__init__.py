"""Benchmarks: ``python -m exonet.bench NAME`` runs ``exonet/bench/NAME.py``'s ``main(argv)``."""
