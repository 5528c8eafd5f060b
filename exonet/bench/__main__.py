"""Dispatch ``python -m exonet.bench NAME [ARGS...]`` to the benchmark module NAME."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import exonet.bench


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = sorted(m.name for m in pkgutil.iter_modules(exonet.bench.__path__) if not m.name.startswith("_"))
    if not argv or argv[0] not in names:
        print(f"usage: python -m exonet.bench NAME [ARGS...]\nbenchmarks: {', '.join(names)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"exonet.bench.{argv[0]}")
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
