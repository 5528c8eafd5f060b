"""The reference processes of the start-up bench: they import torch and nothing else (a module of its own,
so that a spawned child imports no more than this)."""

import torch  # noqa: F401 - importing torch is the work being timed


def import_torch(rank: int) -> None:
    """mp.spawn's entry: torch is imported by now (this module's import); return at once."""
