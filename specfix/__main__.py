"""``python -m specfix`` (or the ``specfix`` console script): command-line entry points.

    python -m specfix bench --device cuda --scale full --json specfix/recorded/bench_h200.json
    python -m specfix bench --device cpu --scale ci --only gumbel     # smoke run: timings mean nothing
    python -m specfix bench --device cuda --scale full --peer .peer   # beside vLLM's own samplers
    specfix diagnose server.log          # a crashed vLLM server's log: the cause, the fix, its release
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    from specfix.tools import bench

    parser = argparse.ArgumentParser(prog="specfix", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="measure kernels and fixes against the hardware ceilings",
                       description="Measure specfix's kernels and fixes (chapter 5). Cases: "
                       + "; ".join(f"{c.name}: {c.summary}" for c in bench.CASES.values()))
    b.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="where to measure (default: specfix.runtime's choice; a CPU runs tiny smoke sizes)")
    b.add_argument("--scale", choices=("ci", "full"), default=None,
                   help="problem sizes on a GPU (default: SPECFIX_SCALE, else ci)")
    b.add_argument("--only", action="append", metavar="NAME",
                   help=f"run only this case (repeatable or comma-separated): {', '.join(bench.CASES)}")
    b.add_argument("--peer", metavar="PATH",
                   help="time vLLM's samplers from this folder (filled by scripts/fetch_vllm_peer.py) "
                   "beside specfix's, same inputs, same process; without it only specfix is timed")
    b.add_argument("--json", metavar="PATH", help="write the results here (schema: the bench docstring)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    d = sub.add_parser("diagnose", help="read a crashed vLLM server's log: the cause, the fix, the release",
                       description="Read a vLLM serving log (device-side asserts, tracebacks, version "
                       "banner, engine arguments) and report the asserts, what Python raised and why it "
                       "points elsewhere, the setup, the ops that launch the failing kernel, a verdict with "
                       "its reasons, and the fixes with the first vLLM release that carries each.")
    d.add_argument("log", metavar="LOG", help="the log file, or - for standard input")
    d.add_argument("--json", action="store_true",
                   help="print the report as JSON (schema: specfix.tools.diagnose.SCHEMA)")
    d.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is one only when standard error is a terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "diagnose":
        from specfix.tools import diagnose

        status, text = diagnose.run(args.log, as_json=args.json, progress=not args.no_progress)
        try:
            print(text, file=sys.stderr if status else sys.stdout)
        except BrokenPipeError:  # `specfix diagnose LOG | head`: the reader has what it wanted
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (so that the exit flush cannot fail again)
        return status
    from specfix import runtime
    from specfix.tools import bench

    only = [n.strip() for item in (args.only or []) for n in item.split(",") if n.strip()] or None
    unknown = [n for n in only or [] if n not in bench.CASES]
    if unknown:
        parser.error(f"--only: unknown case name(s) {', '.join(unknown)}; known: {', '.join(bench.CASES)}")
    device = args.device or runtime.DEVICE.type
    if device == "cuda" and runtime.INTERPRET:
        parser.error("--device cuda: no usable CUDA GPU here (or SPECFIX_DEVICE=cpu is set)")
    if device == "cpu" and runtime.HAS_TRITON and not runtime.INTERPRET:
        parser.error("--device cpu on a GPU machine: Triton compiles for the GPU in this process; "
                     "run with SPECFIX_DEVICE=cpu so that kernels go through the interpreter")
    try:
        report = bench.run(device=device, scale=args.scale or runtime.SCALE, only=only,
                           progress=not args.no_progress, peer=args.peer)
    except ValueError as exc:
        parser.error(str(exc))
    status = 1 if report["errors"] else 0
    if args.json:  # first, so that nothing below can lose the run
        try:
            bench.write_json(report, args.json)
        except ValueError as exc:
            print(f"specfix bench: wrote {args.json}, but it breaks the schema: {exc}", file=sys.stderr)
            status = 1
    print(bench.render(report))
    if args.json:
        print(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
