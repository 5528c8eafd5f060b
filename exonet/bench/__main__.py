"""Dispatch ``python -m exonet.bench NAME [ARGS...]`` to the benchmark module NAME.

A benchmark's ``main(argv)`` returns its figures (a dict) or an exit status; figures exit 0
unless they hold ``"ok": False`` (a check the benchmark makes failed), so callers and tests
read the numbers while the shell still sees the verdict.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import exonet.bench


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = sorted(m.name for m in pkgutil.iter_modules(exonet.bench.__path__) if not m.name.startswith("_"))
    if not argv or argv[0] not in names:
        print(f"usage: python -m exonet.bench NAME [ARGS...]\nbenchmarks: {', '.join(names)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"exonet.bench.{argv[0]}")
    return exit_status(module.main(argv[1:]))


def exit_status(result: dict[str, Any] | int | None) -> int:
    """The process exit status of a benchmark's ``main`` result: figures are 0 unless ``ok`` is False."""
    if isinstance(result, dict):
        return 0 if result.get("ok", True) else 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
