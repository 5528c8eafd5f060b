"""``exonet validate`` (and ``python -m exonet.validate``): run the cases for real, compare, calibrate."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibrate", action="store_true",
                   help="fit efficiency and per-message overhead on half the cases, report the other half, write --out")
    p.add_argument("--matrix", choices=("ci", "full", "slowlinks", "delay", "stages"), default="ci",
                   help="ci: K=2,4 at 10 and 40 Mbit/s plus one DDP run (about 2 min); full: the README matrix; "
                        "slowlinks: tbf-shaped rings over 1-16 TCP streams against the queue model, with the matrix's "
                        "corners, per-tensor all-reduces back to back and DDP's concurrent buckets over gloo "
                        "(about 20 min); delay: the user-space delay line's rate, then gloo's window, Linux's window, "
                        "slow start after idle and the NCCL-like pipelined ring at RTT 20-100 ms against the backend "
                        "models (about 25 min); stages: a pipeline's stage boundary through the delay line, GPipe and "
                        "1F1B micro-batches over gloo (about 3 min)")
    p.add_argument("--recorded", action="store_true",
                   help="with --matrix delay or stages: judge today's model by the delay-line medians last measured "
                        "(exonet/validate/delay_medians.json, stage_medians.json), without root or namespaces")
    p.add_argument("--bands", action="store_true",
                   help="replay every recorded testbed case, and write each regime's p10-p90 of real / model to "
                        "exonet/netsim/bands.json (the simulator's expected range rests on it); no root needed")
    p.add_argument("--measurements", help="calibrate from your own measurements (CSV: op,nodes,bytes,count,bandwidth,"
                                          "seconds) instead of running namespaces")
    p.add_argument("--run", metavar="RUN_DIR",
                   help="calibrate from a recorded run's own collective timings (a fit(run_dir=...) folder or a "
                        "torchrun job's); needs --bandwidth")
    p.add_argument("--bandwidth", help="with --run: each NIC's rate during the run, e.g. '10 Gbit/s'")
    p.add_argument("--link", action="append", default=[], metavar="KEY=VALUE",
                   help="with --run: what you know of the link, set, not fitted (latency, streams, queue, "
                        "tcp_window); repeat for several")
    p.add_argument("--save", help="also write the homogeneous collective measurements to this CSV")
    p.add_argument("--out", default="calibrated.toml", help="where --calibrate writes the fitted scenario")


def run(args: argparse.Namespace) -> int:
    from exonet.validate import calibrate as cal
    from exonet.validate.cases import Measurement, ci_matrix, full_matrix, run_cases
    from exonet.validate.netns import privilege

    _check_outputs(args)
    if args.recorded:
        return _recorded(args.matrix)
    if args.bands:
        return _bands()
    source = args.measurements or args.run
    if args.run and args.measurements:
        print("exonet validate: give --run or --measurements, not both", file=sys.stderr)
        return 2
    measurements: Sequence[Measurement]
    if args.run:
        if not args.bandwidth:
            print("exonet validate: --run needs --bandwidth (each NIC's rate during the run, e.g. '10 Gbit/s')",
                  file=sys.stderr)
            return 2
        from exonet.validate.runs import measurements_from_run

        try:
            measurements = measurements_from_run(args.run, args.bandwidth, _link(args.link))
        except ValueError as exc:
            print(f"exonet validate: {exc}", file=sys.stderr)
            return 2
        print(f"exonet validate: {len(measurements)} kinds of blocking collective timed in {args.run}")
    elif args.measurements:
        measurements = cal.read_measurements(args.measurements)
    else:
        reason = privilege()
        if reason:
            print(f"exonet validate: {reason}", file=sys.stderr)
            return 1
        own = {"slowlinks": _slow_links, "delay": _delay, "stages": _stages}.get(args.matrix)
        if own is not None:  # a matrix with tables of its own
            return own()
        cases = ci_matrix() if args.matrix == "ci" else full_matrix()
        load = os.getloadavg()[0]
        print(f"exonet validate: {len(cases)} cases on network namespaces (load average {load:.2f} "
              f"on {os.cpu_count()} cores)", flush=True)
        t0 = time.perf_counter()
        measurements = run_cases(cases, log=lambda line: print(line, flush=True))
        print(f"measured in {time.perf_counter() - t0:.0f} s (load average now {os.getloadavg()[0]:.2f})")
    if args.save and not args.measurements:
        print(f"measurements: {cal.write_measurements(measurements, args.save)}")
    if args.calibrate:
        result = cal.calibrate(measurements, None if source else os.cpu_count())
        if source:
            toml = result.to_toml(name=Path(args.out).stem,
                                  description=f"fitted by exonet validate --calibrate to {Path(source).name}")
        else:
            toml = result.to_toml()
        Path(args.out).write_text(toml)
    else:
        result = cal.compare(measurements, cal.preset_params(), [True] * len(measurements), "calibrated-loopback")
    print(result.table())
    if args.calibrate:
        print(f"calibrated scenario: {args.out}")
    return 0


def _link(pairs: list[str]) -> dict[str, object]:
    """``--link KEY=VALUE`` options as a dict (``streams`` as an integer)."""
    from exonet.validate.calibrate import link_value

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"--link: expected KEY=VALUE (e.g. latency=25ms), got {pair!r}")
        out[key.strip()] = link_value(key.strip(), value.strip())
    return out


def _slow_links() -> int:
    """Run the real-slow-links matrix, its held-out cases, its corners, back-to-back all-reduces, the sweep of
    streams through a shallow queue and DDP's buckets; print real, ideal and model per case."""
    from exonet.validate import buckets
    from exonet.validate.slowlinks import (
        back_to_back,
        corners,
        held_out,
        matrix,
        report,
        run_case,
        stream_held_out,
        stream_sweep,
    )

    for title, cases in (("read the recovery constant from", matrix()), ("held out", held_out()),
                         ("the matrix's corners", corners()), ("back to back", back_to_back()),
                         ("many streams in a shallow queue", stream_sweep()),
                         ("many streams, held out", stream_held_out())):
        print(f"\n{len(cases)} cases ({title}), load average {os.getloadavg()[0]:.2f}", flush=True)
        report([run_case(case) for case in cases])
    ddp = buckets.matrix()
    print(f"\n{len(ddp)} cases (DDP: concurrent bucket all-reduces and a per-step broadcast over gloo), "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    buckets.report([buckets.run_case(case) for case in ddp])
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """The files --save and --out will write, checked before the measurements, which take minutes."""
    from exonet.files import check_output

    for flag, path in (("--save", args.save), ("--out", args.out if args.calibrate else None)):
        if path:
            check_output(path, flag)


def _recorded(matrix: str) -> int:
    """Today's model against the delay-line medians last measured (no root, no namespaces)."""
    if matrix == "stages":
        from exonet.validate.stages import recorded_report as stage_report

        stage_report()
        return 0
    if matrix != "delay":
        print("exonet validate: --recorded judges the delay-line medians: give --matrix delay or stages",
              file=sys.stderr)
        return 2
    from exonet.validate.windows import recorded_report

    recorded_report()
    return 0


def _bands() -> int:
    """Write the model's measured error bands per regime (exonet/validate/residuals.py) and print them."""
    from exonet.validate.residuals import BANDS, write_bands

    for regime, band in write_bands().items():
        print(f"{regime}: real / model p10 {band['p10']:.3f}, p90 {band['p90']:.3f} over {band['cases']} cases")
    print(f"wrote {BANDS}")
    return 0


def _delay() -> int:
    """Measure the delay line's rate, then run the delay-line cases (two fresh networks each); print each table."""
    from exonet.validate import windows
    from exonet.validate.delayline import RATE_HEADER, line_rate

    print(f"\nthe delay line's rate (16 TCP streams, 6 s), load average {os.getloadavg()[0]:.2f}", flush=True)
    print(RATE_HEADER)
    for delay in (0.01, 0.025, 0.05):
        for mbit in (250, 500, 1000):
            print(line_rate(delay, mbit * 1e6 / 8).row(), flush=True)
    for title, cases in (("gloo's window", windows.window_limited()), ("Linux's window", windows.tcp_window()),
                         ("slow start after idle", windows.slow_start()),
                         ("the NCCL-like pipelined ring", windows.pipelined()),
                         ("sequences of calls", windows.sequences())):
        print(f"\n{len(cases)} cases ({title}), load average {os.getloadavg()[0]:.2f}", flush=True)
        measured = [windows.run_case(case, runs=2) for case in cases]
        windows.report(measured)
        if any(case.idle for case in cases):
            windows.idle_report(measured)
    return 0


def _stages() -> int:
    """Run a pipeline's stage boundary through the delay line (``exonet.validate.stages``); print the table."""
    from exonet.validate import stages

    cases = stages.matrix()
    print(f"\n{len(cases)} cases (a pipeline's stage boundary), load average {os.getloadavg()[0]:.2f}", flush=True)
    stages.report([stages.run_case(case) for case in cases])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exonet.validate", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
