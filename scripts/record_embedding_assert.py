"""Record chapter 2's GPU evidence: the real device-side assert and the op table.

    PYTHONPATH=$PWD python3 scripts/record_embedding_assert.py --out specfix/recorded

Writes two labelled JSON files (``specfix.tools.recorded.save``) into ``--out``:

* ``embedding_assert_transcripts.json``: child runs (exit status, merged stdout/stderr, events) of
  ``F.embedding`` with a -1 id, with and without ``CUDA_LAUNCH_BLOCKING=1``, and of the specfix engine
  with ``Fixes(clamp_placeholders=False)``, likewise;
* ``embedding_assert_ops.json``: for each op of ``specfix.lab.embedding_assert.OPS`` and each bad index
  (-1, size), with 3 and with 4096 indices: what CUDA does (each case in its own child) and what the CPU does.

What the placeholder fixes cost per step is recorded once, by the bench (``python -m specfix bench``, case
``placeholder_fixes``, into ``bench_h200.json``), and chapters 2 and 5 both read it from there.

Every child has a timeout; a case that fails is written down as data, never aborts the recording.
Needs a CUDA GPU (``--allow-cpu`` runs it anyway, for testing the script: the results then mean nothing).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specfix.lab import embedding_assert as ea
from specfix.tools import recorded

SECTIONS = ("transcripts", "ops")
INDEX_COUNTS = (3, 4096)


def log(message: str) -> None:
    print(f"[record_embedding_assert] {message}", file=sys.stderr, flush=True)


def record_transcripts(timeout: float) -> dict:
    runs = {}
    for blocking in (False, True):
        env = {"CUDA_LAUNCH_BLOCKING": "1" if blocking else "0"}
        suffix = "_blocking" if blocking else ""
        jobs = {f"minimal{suffix}": ea.minimal_crash_code()}
        pipeline = ea.pipeline_crash_code()
        if pipeline is not None:
            jobs[f"pipeline{suffix}"] = pipeline
        for name, code in jobs.items():
            log(f"transcript {name}")
            runs[name] = ea.run_until_asserts(code, label=name, env=env, timeout=timeout).to_json()
    return {"runs": runs, "pipeline_available": ea.pipeline_crash_code() is not None}


def record_ops(timeout: float) -> dict:
    rows = ea.op_table_rows(INDEX_COUNTS, timeout=timeout, progress=lambda case: log(f"op {case}"))
    return {"rows": rows, "weight_shape": [ea.ROWS, ea.COLS]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=recorded.RECORDED_DIR, help="output directory")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="record only this section")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds allowed per child process")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (tests the script only)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        parser.error("no CUDA GPU: these recordings are GPU evidence (--allow-cpu only tests the script)")
    sections = args.only or list(SECTIONS)
    started = time.perf_counter()
    makers = {
        "transcripts": lambda: record_transcripts(args.timeout),
        "ops": lambda: record_ops(args.timeout),
    }
    for section in sections:
        log(f"wrote {recorded.save(f'embedding_assert_{section}', makers[section](), args.out)}")
    log(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
