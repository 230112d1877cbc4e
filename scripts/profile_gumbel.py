"""Profile the Gumbel sampler with Nsight Compute on a GPU: what chapter 5 explains its misses from.

    python scripts/profile_gumbel.py --before old=PATH_TO_OLDER_gumbel.py --out specfix/recorded

runs itself under ``ncu --clock-control none`` (one launch per case, after every case has compiled), reads
back one row of metrics per kernel and writes ``gumbel_ncu_h200.json``: per case the kernel's time, its
DRAM and SM throughput, how often a scheduler issued, the instructions it executed per logit, its registers
and occupancy, and the warp stall reasons (cycles stalled per issued instruction). The cases are the rate
goal's shapes (256 x 32,000 fp32 and 1,024 x 151,936 bf16), the same kernel at 256 x 32,000 bf16,
256 x 151,936 and 1,024 x 151,936 fp32, the masked and unmasked kernels with the draft-logits cache store,
and, with ``--before``, an older kernel at the same shapes.
Per unstored "today" case it also records the kernel's hot loop (``kernel["hot_loop"]``, no ncu needed): the
SASS instructions per logit of the loop that a backward branch encloses most of, by part of the source.
``--hot-loop-only`` prints that table and writes nothing; ``--arch 90`` compiles it offline, without a GPU.
"""

from __future__ import annotations

import argparse
import collections
import csv
import inspect
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

# Compiling offline for a GPU this machine lacks: specfix must plan and compile its kernels as on one.
if "--arch" in sys.argv and not torch.cuda.is_available():
    os.environ.update(SPECFIX_DEVICE="cuda", TRITON_INTERPRET="0")  # compiled kernels, not interpreted
    torch.cuda.is_available = lambda: True
    torch._C._cuda_getCurrentRawStream = lambda device: 0  # specfix.runtime imports it; a CPU torch lacks it
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from time_gumbel import before_call, call, inputs, load_before  # noqa: E402

from specfix import Fixes  # noqa: E402
from specfix.lab.masked_gumbel import gumbel_batch  # noqa: E402
from specfix.mrv2 import gumbel  # noqa: E402
from specfix.mrv2 import noise as N  # noqa: E402
from specfix.runtime import triton  # noqa: E402
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
    "1,024 x 151,936 bf16": (1024, 151_936, "bf16"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int32: "i32", torch.int64: "i64"}
HOT_PARTS = ("hash", "logarithms", "argmax", "logits in", "loop")
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


def _bin(tool: str) -> str:
    """A CUDA tool triton bundles (the nvdisasm of its own ptxas's release)."""
    return str(Path(inspect.getfile(triton)).parent / "backends" / "nvidia" / "bin" / tool)


def hot_loop_instructions(sass: str) -> list[tuple[str, int, str]]:
    """(file, line, opcode) of each instruction of the loop whose backward branch encloses the most, from
    ``nvdisasm -c -g``'s text: the line is the last ``//## File`` marker above the instruction."""
    found, labels, where = [], {}, ("", 0)
    for text in sass.splitlines():
        if marker := re.search(r'//## File "(.*?)", line (\d+)', text):
            where = (marker[1], int(marker[2]))
        elif label := re.match(r"\.(L_x_\d+):", text):
            labels[label[1]] = len(found)
        elif op := re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([\w.]+)(.*);", text):
            found.append((*where, op[1], op[2]))
    loops = [
        (labels[target[1]], i + 1)
        for i, (*_, opcode, rest) in enumerate(found)
        if opcode == "BRA" and (target := re.search(r"\.(L_x_\d+)", rest)) and labels[target[1]] <= i
    ]
    start, end = max(loops, key=lambda loop: loop[1] - loop[0])
    return [(path, line, opcode) for path, line, opcode, _ in found[start:end]]


def source_parts() -> dict[tuple[str, int], str]:
    """(file, line) -> part, for the lines of the jitted functions the hot loop runs. The kernel's own lines
    are the loop's, but those that load or convert the logits, and the token's hash multiplier."""
    out = {}
    for fn, part in (
        (N._uniform, "hash"),
        (N._fast_gumbel_log2, "logarithms"),
        (N._neg_log2, "logarithms"),
        (gumbel._first_max, "argmax"),
        (gumbel._keep_best, "argmax"),
        (gumbel.gumbel_block_argmax, "logits in"),  # the scale, in the FMA that adds the noise
        (gumbel._gumbel_sample_kernel, "loop"),
    ):
        lines, first = inspect.getsourcelines(fn.fn)
        for number, text in enumerate(lines, first):
            if part == "loop" and "TOKEN_MULT" in text:
                out[(inspect.getsourcefile(fn.fn), number)] = "hash"
            elif part == "loop" and ("tl.load" in text or "tl.float32" in text):
                out[(inspect.getsourcefile(fn.fn), number)] = "logits in"
            else:
                out[(inspect.getsourcefile(fn.fn), number)] = part
    return out


def count_parts(instructions: list[tuple[str, int, str]], parts: dict) -> dict[str, int]:
    """Instructions per part: a branch is the loop's, triton's own library (tl.reduce) the argmax's."""
    counts = collections.Counter(
        "loop"
        if opcode == "BRA"
        else "argmax"
        if "triton/language" in path
        else parts.get((path, line), "loop")
        for path, line, opcode in instructions
    )
    return {part: counts[part] for part in HOT_PARTS}


def hot_loop(rows: int, vocab: int, dname: str, arch: int | None = None) -> dict:
    """The hot loop of the fast-noise kernel as ``gumbel_sample`` compiles it for this case (for this GPU,
    or offline for sm_``arch``): SASS instructions per logit by part, and the kernel's registers."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dtype = DTYPES[dname]
    plan = gumbel._plan(rows, vocab, dtype.itemsize, ("fast", False, False, False, True), (None, None, None))
    inp = gumbel_batch(1, 16, dtype=dtype)  # the bench's dtypes
    kernel = gumbel._gumbel_sample_kernel
    pointers = {
        "out_ptr": torch.int64,
        "split_best_ptr": torch.int64,  # `out` itself where a row is one program
        "arrivals_ptr": torch.int32 if plan.num_splits > 1 else torch.int64,
        "logits_ptr": dtype,
        "idx_mapping_ptr": inp["expanded_idx_mapping"].dtype,
        "temperature_ptr": inp["temperature"].dtype,
        "seed_ptr": inp["seed"].dtype,
        "pos_ptr": inp["pos"].dtype,
    }
    ints = dict(logits_stride=vocab, cache_stride0=0, cache_stride1=0, source_stride=0, col_stride=0)
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in plan.eager or name in ("cache_ptr", "col_ptr", "source_ptr"):  # no cache: None
            signature[name], constants[(i,)] = "constexpr", plan.eager.get(name)
        else:
            signature[name] = "*" + TRITON_TYPES[pointers[name]] if name in pointers else "i32"
        if name in pointers or ints.get(name, 1) % 16 == 0:  # as triton specialises them
            attrs[(i,)] = [["tt.divisibility", 16]]
    options = {k: v for k, v in plan.eager.items() if k not in kernel.arg_names}
    target = GPUTarget("cuda", arch, 32) if arch else triton.runtime.driver.active.get_current_target()
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=target, options=options)
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"gumbel_hot_loop_{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        sass = subprocess.run(
            [_bin("nvdisasm"), "-c", "-g", cubin], capture_output=True, text=True, check=True
        )
        usage = subprocess.run(
            [_bin("cuobjdump"), "--dump-resource-usage", cubin], capture_output=True, text=True, check=True
        )
    finally:
        cubin.unlink()
    counts = count_parts(hot_loop_instructions(sass.stdout), source_parts())
    per_turn = 2 * plan.eager["DEPTH"] * plan.eager["LANES"] // (32 * plan.eager["num_warps"])
    return {
        "per_logit": {part: n / per_turn for part, n in counts.items()},
        "total_per_logit": sum(counts.values()) / per_turn,
        "logits_per_thread_per_turn": per_turn,
        "registers": int(re.search(r"REG:(\d+)", usage.stdout)[1]),
    }


def print_hot_loop(case: str, loop: dict) -> None:
    parts = "  ".join(f"{part} {x:5.2f}" for part, x in loop["per_logit"].items())
    total, registers = loop["total_per_logit"], loop["registers"]
    print(f"hot loop {case:22s} {parts}  total {total:5.2f} per logit  regs {registers}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "specfix" / "recorded"))
    parser.add_argument("--before", action="append", default=[], help="NAME=PATH of an older gumbel.py")
    parser.add_argument("--launch", action="store_true", help="(internal) the process ncu profiles")
    parser.add_argument("--hot-loop-only", action="store_true", help="print the hot loops, write nothing")
    parser.add_argument("--arch", type=int, help="compile the hot loops offline for sm_ARCH (e.g. 90)")
    args = parser.parse_args()
    if args.hot_loop_only:
        for name, (rows, vocab, dname) in SHAPES.items():
            print_hot_loop(name, hot_loop(rows, vocab, dname, args.arch))
        return
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
        if d["kernel"] == "today" and not d["store"]:
            k["hot_loop"] = hot_loop(d["rows"], d["vocab"], d["dtype"])
            print_hot_loop(d["shape"], k["hot_loop"])
            if k["hot_loop"]["registers"] != k["registers_per_thread"]:  # not the kernel ncu profiled
                print(f"warning: the hot loop's kernel has other registers than ncu's ({d['shape']})")
    meta = recorded.gpu_meta("gumbel_ncu_h200")
    version = subprocess.run(["ncu", "--version"], capture_output=True, text=True, check=False).stdout
    meta["ncu"] = version.strip().splitlines()[-1]
    nvdisasm = subprocess.run([_bin("nvdisasm"), "--version"], capture_output=True, text=True).stdout
    release = next(line for line in nvdisasm.splitlines() if "release" in line)
    meta["hot_loop"] = (
        f"triton {triton.__version__} compiled for this GPU, nvdisasm -c -g ({release}): "
        "the loop whose backward branch encloses the most SASS instructions, each counted to the part of "
        "its source line"
    )
    meta["command"] = "ncu --clock-control none --print-units base --metrics <the metrics below>"
    report = {"meta": meta, "metrics": METRICS, "kernels": kernels}
    path = Path(args.out) / "gumbel_ncu_h200.json"
    path.write_text(json.dumps(report, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
