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
import tempfile
from pathlib import Path


def _parser(cases: dict | None = None) -> argparse.ArgumentParser:
    """The parser; ``cases`` (``bench.CASES``) are left out for ``diagnose``, which must not import torch."""
    cases = cases or {}
    parser = argparse.ArgumentParser(prog="specfix", description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "bench",
        help="measure kernels and fixes against the hardware ceilings",
        description="Measure specfix's kernels and fixes (chapter 5). Cases: "
        + "; ".join(f"{c.name}: {c.summary}" for c in cases.values()),
    )
    b.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where to measure (default: specfix.runtime's choice; a CPU runs tiny smoke sizes)",
    )
    b.add_argument("--scale", choices=("ci", "full"), help="problem sizes on a GPU (default: SPECFIX_SCALE)")
    b.add_argument(
        "--only",
        action="extend",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        metavar="NAME",
        help=f"run only this case (repeatable or comma-separated): {', '.join(cases)}",
    )
    b.add_argument(
        "--peer",
        metavar="PATH",
        help="time vLLM's samplers from this folder (filled by scripts/fetch_vllm_peer.py) "
        "beside specfix's, same inputs, same process; without it only specfix is timed",
    )
    b.add_argument("--json", metavar="PATH", help="write the results here (schema: the bench docstring)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    d = sub.add_parser(
        "diagnose",
        help="read a crashed vLLM server's log: the cause, the fix, the release",
        description="Report a vLLM serving log's asserts, what Python raised and why it points elsewhere, "
        "the setup, the ops that launch the failing kernel, a verdict, and each fix with its first release.",
    )
    d.add_argument("log", metavar="LOG", help="the log file, or - for standard input")
    b.set_defaults(parser=b)
    d.set_defaults(parser=d)
    d.add_argument(
        "--json", action="store_true", help="print the report as JSON (schema: specfix.tools.diagnose.SCHEMA)"
    )
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments; one a subcommand does not know is refused with that subcommand's usage."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["diagnose"]:
        args = _parse(_parser(), argv)
        from specfix.tools import diagnose

        status, text = diagnose.run(args.log, as_json=args.json)
        try:
            print(text, file=sys.stderr if status else sys.stdout)
        except BrokenPipeError:  # `specfix diagnose LOG | head`: the reader has what it wanted
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (so that the exit flush cannot fail again)
        return status
    from specfix.tools import bench

    args = _parse(_parser(bench.CASES), argv)
    return _bench(args.parser, args)


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from specfix import runtime
    from specfix.tools import bench

    if args.json and (problem := _unwritable(args.json)):
        parser.error(f"--json {args.json}: {problem}")
    device = args.device or runtime.DEVICE.type
    if device == "cpu" and runtime.HAS_TRITON and not runtime.INTERPRET:
        parser.error(
            "--device cpu on a GPU machine: Triton compiles for the GPU in this process; "
            "run with SPECFIX_DEVICE=cpu so that kernels go through the interpreter"
        )
    try:
        report = bench.run(
            device=device,
            scale=args.scale or runtime.SCALE,
            only=args.only,
            progress=not args.no_progress,
            peer=args.peer,
        )
    except ValueError as exc:  # bench.run checks its arguments before it runs anything
        parser.error(str(exc))
    status = 1 if report["errors"] else 0
    written = False
    if args.json:  # first, so that nothing below can lose the run
        try:
            bench.write_json(report, args.json)
            written = True
        except OSError as exc:
            print(
                f"specfix bench: could not write {args.json} ({exc.strerror or exc}); the report follows",
                file=sys.stderr,
            )
            status = 1
        except ValueError as exc:
            print(f"specfix bench: wrote {args.json}, but it breaks the schema: {exc}", file=sys.stderr)
            status = 1
    print(bench.render(report))
    if written:
        print(f"wrote {args.json}")
    return status


def _unwritable(path: str) -> str | None:
    """Why a report could not be written to ``path``, found by trying before a long run; None if it can."""
    target = Path(path).absolute()
    if target.is_dir():
        return "is a folder"
    folder = next(p for p in target.parents if p.exists())
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if folder != target.parent:  # a mistyped folder would otherwise be made
        return f"no folder {target.parent}: make it first"
    try:
        if target.exists():
            open(target, "a").close()  # noqa: SIM115  (opened to append nothing: the file stays as it is)
        else:
            tempfile.NamedTemporaryFile(dir=folder).close()  # noqa: SIM115
    except OSError as exc:
        return f"cannot write there ({exc.strerror or exc})"
    return None


if __name__ == "__main__":
    sys.exit(main())
