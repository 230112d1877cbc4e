"""Profile the Gumbel sampler with Nsight Compute on a GPU: what chapter 5 explains its misses from.

    python scripts/profile_gumbel.py --before old=PATH_TO_OLDER_gumbel.py --out specfix/recorded

runs itself under ``ncu --clock-control none`` (one launch per case, after every case has compiled), reads
back one row of metrics per kernel and writes ``gumbel_ncu_h200.json``: per case the kernel's time, its
DRAM and SM throughput, how often a scheduler issued, the instructions it executed per logit, its registers
and occupancy, and the warp stall reasons (cycles stalled per issued instruction). The cases are the bench's
missed shapes (256 x 32,000 and 256 x 151,936), a shape that meets its goal (1,024 x 151,936), the masked
and unmasked kernels with the draft-logits cache store, and, with ``--before``, an older kernel at the same
shapes.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from time_gumbel import before_call, call, inputs, load_before  # noqa: E402

from specfix import Fixes  # noqa: E402
from specfix.mrv2 import gumbel  # noqa: E402
from specfix.tools import recorded  # noqa: E402

STALLS = (
    "long_scoreboard",
    "short_scoreboard",
    "wait",
    "math_pipe_throttle",
    "mio_throttle",
    "lg_throttle",
    "barrier",
    "membar",
    "branch_resolving",
    "no_instruction",
    "not_selected",
    "selected",
    "dispatch_stall",
    "drain",
    "imc_miss",
    "sleeping",
    "tex_throttle",
)
METRICS = {
    "gpu__time_duration.sum": "time_us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "dram__bytes_read.sum": "dram_bytes_read",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct_of_peak",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_active_pct",
    "smsp__inst_executed.sum": "warp_instructions",
    "smsp__thread_inst_executed.sum": "thread_instructions",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
    "launch__waves_per_multiprocessor": "waves_per_sm",
    **{f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio": f"stall_{s}" for s in STALLS},
}
SHAPES = {  # case -> (rows, vocab, dtype name)
    "256 x 32,000 fp32": (256, 32_000, "fp32"),
    "256 x 32,000 bf16": (256, 32_000, "bf16"),
    "256 x 151,936 fp32": (256, 151_936, "fp32"),
    "1,024 x 151,936 fp32": (1024, 151_936, "fp32"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def cases(befores: dict) -> list[tuple[dict, object]]:
    """(description, call) of each profiled launch, in launch order."""
    out = []
    for name, (rows, vocab, dname) in SHAPES.items():
        inp = inputs(rows, vocab, DTYPES[dname])
        out.append(
            (
                dict(
                    kernel="today", shape=name, rows=rows, vocab=vocab, dtype=dname, store=False, masked=True
                ),
                call(inp, noise="fast"),
            )
        )
        for before_name, module in befores.items():
            out.append(
                (
                    dict(
                        kernel=f"before: {before_name}",
                        shape=name,
                        rows=rows,
                        vocab=vocab,
                        dtype=dname,
                        store=False,
                        masked=True,
                    ),
                    before_call(module, inp),
                )
            )
    rows, vocab, dname = SHAPES["256 x 151,936 fp32"]
    inp = inputs(rows, vocab, torch.float32)
    processed = torch.empty(rows, 1, vocab, device="cuda")
    for masked in (True, False):
        out.append(
            (
                dict(
                    kernel="today",
                    shape="256 x 151,936 fp32",
                    rows=rows,
                    vocab=vocab,
                    dtype=dname,
                    store=True,
                    masked=masked,
                ),
                call(inp, noise="fast", logits_cache=processed, fixes=Fixes(mask_invalid_reqs=masked)),
            )
        )
    return out


def launch(befores: dict) -> None:
    """The profiled process: compile and warm every case, then one launch each between profiler marks."""
    todo = cases(befores)
    for _, fn in todo:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, fn in todo:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def parse(text: str) -> list[dict]:
    """ncu's raw CSV page: a header row, a units row, then one row per kernel."""
    rows = list(csv.reader(io.StringIO(text[text.index('"ID"') :])))
    header, units, body = rows[0], rows[1], rows[2:]
    out = []
    for row in body:
        values = dict(zip(header, row, strict=True))
        kernel = {"name": values["Kernel Name"]}
        for metric, key in METRICS.items():
            raw = values.get(metric, "").replace(",", "")
            unit = units[header.index(metric)] if metric in header else ""
            value = float(raw) if raw not in ("", "n/a") else None
            if value is not None and metric == "gpu__time_duration.sum":
                value *= TO_US[unit]
            kernel[key] = value
        out.append(kernel)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "specfix" / "recorded"))
    parser.add_argument("--before", action="append", default=[], help="NAME=PATH of an older gumbel.py")
    parser.add_argument("--launch", action="store_true", help="(internal) the process ncu profiles")
    args = parser.parse_args()
    befores = {b.split("=", 1)[0]: load_before(b.split("=", 1)[1]) for b in args.before}
    if args.launch:
        launch(befores)
        return
    command = [
        "ncu",
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "-k",  # an older kernel that splits rows adds a reduce kernel per call: folded into its row below
        "regex:_gumbel_(sample|reduce)_kernel",
        "--metrics",
        ",".join(METRICS),
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        sys.executable,
        __file__,
        "--launch",
        *[f"--before={b}" for b in args.before],
    ]
    if shutil.which("ncu") is None:
        sys.exit("profile_gumbel.py: ncu (Nsight Compute) is not on PATH; nothing was recorded")
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ), check=False)
    if done.returncode:
        sys.exit(f"ncu failed ({done.returncode}):\n{done.stderr[-4000:]}\n{done.stdout[-4000:]}")
    kernels = []
    for k in parse(done.stdout):  # a reduce kernel's time and instructions count to the call before it
        if "reduce" in k["name"] and kernels:
            kernels[-1]["time_us"] += k["time_us"]
            kernels[-1]["thread_instructions"] += k["thread_instructions"]
            kernels[-1]["reduce_us"] = k["time_us"]  # the rates and stalls stay the sampling kernel's
        else:
            kernels.append(k)
    described = [d for d, _ in cases(befores)]
    if len(kernels) != len(described):
        sys.exit(f"expected {len(described)} profiled kernels, got {len(kernels)}:\n{done.stdout[-4000:]}")
    for d, k in zip(described, kernels, strict=True):
        k.update(d)
        k["instructions_per_logit"] = k["thread_instructions"] / (d["rows"] * d["vocab"])
        k["register_cap"] = gumbel._REGISTER_CAP.get("maxnreg") if d["kernel"] == "today" else None
        print(
            f"{k['kernel']:14s} {k['shape']:22s} store={d['store']!s:5s} masked={d['masked']!s:5s} "
            f"{k['time_us']:8.1f} us  dram {k['dram_pct_of_peak']:5.1f}%  "
            f"issue {k['issue_active_pct']:5.1f}%  {k['instructions_per_logit']:5.1f} inst/logit  "
            f"regs {k['registers_per_thread']:.0f}",
            flush=True,
        )
    meta = recorded.gpu_meta("gumbel_ncu_h200")
    version = subprocess.run(["ncu", "--version"], capture_output=True, text=True, check=False).stdout
    meta["ncu"] = version.strip().splitlines()[-1]
    meta["command"] = "ncu --clock-control none --print-units base --metrics <the metrics below>"
    report = {"meta": meta, "metrics": METRICS, "kernels": kernels}
    path = Path(args.out) / "gumbel_ncu_h200.json"
    path.write_text(json.dumps(report, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
