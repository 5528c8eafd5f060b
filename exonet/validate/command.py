"""``exonet validate`` (and ``python -m exonet.validate``): run the cases for real, compare, calibrate."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibrate", action="store_true",
                   help="fit efficiency and per-message overhead on half the cases, report the other half, write --out")
    p.add_argument("--matrix", choices=("ci", "full", "slowlinks"), default="ci",
                   help="ci: K=2,4 at 10 and 40 Mbit/s plus one DDP run (about 2 min); full: the README matrix; "
                        "slowlinks: tbf-shaped rings over 1-16 TCP streams against the queue model (about 10 min)")
    p.add_argument("--measurements", help="calibrate from your own measurements (CSV: op,nodes,bytes,count,bandwidth,"
                                          "seconds) instead of running namespaces")
    p.add_argument("--save", help="also write the homogeneous collective measurements to this CSV")
    p.add_argument("--out", default="calibrated.toml", help="where --calibrate writes the fitted scenario")


def run(args: argparse.Namespace) -> int:
    from exonet.validate import calibrate as cal
    from exonet.validate.cases import ci_matrix, full_matrix, run_cases
    from exonet.validate.netns import privilege

    if args.measurements:
        measurements = cal.read_measurements(args.measurements)
    else:
        reason = privilege()
        if reason:
            print(f"exonet validate: {reason}", file=sys.stderr)
            return 1
        if args.matrix == "slowlinks":
            return _slow_links()
        cases = ci_matrix() if args.matrix == "ci" else full_matrix()
        load = os.getloadavg()[0]
        print(f"exonet validate: {len(cases)} cases on network namespaces (load average {load:.2f} "
              f"on {os.cpu_count()} cores)", flush=True)
        t0 = time.perf_counter()
        measurements = run_cases(cases, log=lambda line: print(line, flush=True))
        print(f"measured in {time.perf_counter() - t0:.0f} s (load average now {os.getloadavg()[0]:.2f})")
        if args.save:
            print(f"measurements: {cal.write_measurements(measurements, args.save)}")
    if args.calibrate:
        result = cal.calibrate(measurements, None if args.measurements else os.cpu_count())
        if args.measurements:
            toml = result.to_toml(name=Path(args.out).stem,
                                  description="fitted by exonet validate --calibrate to "
                                              f"{Path(args.measurements).name}")
        else:
            toml = result.to_toml()
        Path(args.out).write_text(toml)
    else:
        result = cal.compare(measurements, cal.preset_params(), [True] * len(measurements), "calibrated-loopback")
    print(result.table())
    if args.calibrate:
        print(f"calibrated scenario: {args.out}")
    return 0


def _slow_links() -> int:
    """Run the real-slow-links matrix and its held-out cases; print real, ideal and model per case."""
    from exonet.validate.slowlinks import corners, held_out, matrix, report, run_case

    for title, cases in (("read the recovery constant from", matrix()), ("held out", held_out()),
                         ("the matrix's corners", corners())):
        print(f"\n{len(cases)} cases ({title}), load average {os.getloadavg()[0]:.2f}", flush=True)
        report([run_case(case) for case in cases])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exonet.validate", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
