"""Run compute-sanitizer memcheck on the masked and the unmasked (pre-PR-#47066) Gumbel kernel; record both.

    PYTHONPATH=$PWD python3 scripts/sanitize_gumbel.py [--out specfix/recorded]

Each variant runs in a child process under ``compute-sanitizer --tool memcheck`` with torch's caching
allocator off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``: every tensor is its own cudaMalloc, so an access
just outside one is outside any allocation) and padding after every allocation, so that row -1 of a table
lands in memory the sanitizer knows is nobody's. The batch has two live rows and two padded rows (-1).
Expected: 0 errors with the mask; without it, invalid reads of temperature[-1] (fatal: the kernel stops
there) and, with the tables inside larger allocations, invalid writes of draft_logits[-1, 1, :].
Writes ``gumbel_sanitizer.json`` (per variant: error counts by kind, the first report of each, the command).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {
    "masked": "the fixed kernel",
    "unmasked": "the pre-fix kernel: its first bad access, temperature[-1], is fatal under memcheck",
    "unmasked_guarded_tables": "the pre-fix kernel with temperature and seed inside larger allocations (so "
    "reading row -1 stays in bounds and goes unseen) and draft logits alone: "
    "the stray write of row -1 is caught",
}


def child(variant: str) -> None:
    import torch

    from specfix import Fixes
    from specfix.mrv2 import gumbel

    vocab = 4096
    logits = torch.randn(4, vocab, device="cuda")
    idx = torch.tensor([0, 1, -1, -1], device="cuda")
    if variant == "unmasked_guarded_tables":
        temperature, _ = gumbel.guarded_table((2,), 1.0, torch.float32, device="cuda")
        seed, _ = gumbel.guarded_table((2,), 5, torch.int64, device="cuda")
    else:
        temperature = torch.ones(2, device="cuda")
        seed = torch.full((2,), 5, device="cuda")
    temperature[1] = 0.7
    pos = torch.tensor([3, 4, 0, 0], device="cuda")
    draft_logits = torch.zeros(2, 3, vocab, device="cuda")
    tokens = gumbel.gumbel_sample(
        logits,
        idx,
        temperature,
        seed,
        pos,
        True,
        True,
        draft_logits,
        1,
        fixes=Fixes(mask_invalid_reqs=variant == "masked"),
    )
    torch.cuda.synchronize()
    print("tokens", tokens.tolist())


def error_kinds(text: str) -> dict:
    """Per kind of error ("Invalid __global__ read of size 4 bytes", ...): how many, how far outside the
    nearest allocation they reached, and the first full report."""
    kinds: dict[str, dict] = {}
    blocks = re.split(r"(?m)^(?==========\s+Invalid)", text)
    for block in blocks[1:]:
        lines = [
            line
            for line in block.splitlines()
            if line.startswith("=========") and "ERROR SUMMARY" not in line
        ]
        head = lines[0].removeprefix("=========").strip()
        kind = kinds.setdefault(head, {"count": 0, "bytes_before_allocation": [], "first": lines[:6]})
        kind["count"] += 1
        far = re.search(r"is ([\d,]+) bytes before the nearest allocation", block)
        if far:
            kind["bytes_before_allocation"].append(int(far.group(1).replace(",", "")))
    for kind in kinds.values():
        far = kind.pop("bytes_before_allocation")
        kind["bytes_before_allocation_range"] = [min(far), max(far)] if far else None
    return kinds


def run_variant(variant: str) -> dict:
    cmd = [
        "compute-sanitizer",
        "--tool",
        "memcheck",
        "--padding",
        str(1 << 20),
        "--print-limit",
        "100000",
        sys.executable,
        __file__,
        "--child",
        variant,
    ]
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=500)
    text = proc.stdout + proc.stderr
    match = re.search(r"ERROR SUMMARY: (\d+) error", text)
    return {
        "command": " ".join(
            [
                "PYTORCH_NO_CUDA_MEMORY_CACHING=1",
                *cmd[:-4],
                "python3",
                "scripts/sanitize_gumbel.py",
                *cmd[-2:],
            ]
        ),
        "what": VARIANTS[variant],
        "returncode": proc.returncode,
        "errors": int(match.group(1)) if match else None,
        "kinds": error_kinds(text),
        "summary": [line for line in text.splitlines() if "ERROR SUMMARY" in line],
        "child_output": [line for line in text.splitlines() if line.startswith("tokens")],
        "program_hit": [line for line in text.splitlines() if "Program hit" in line][:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "specfix" / "recorded"))
    parser.add_argument("--child", choices=list(VARIANTS))
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if shutil.which("compute-sanitizer") is None:
        sys.exit(
            "sanitize_gumbel.py: compute-sanitizer is not on PATH (it comes with the CUDA toolkit: add "
            "its bin/ folder to PATH); nothing was recorded"
        )
    from specfix.tools import recorded

    results = {variant: run_variant(variant) for variant in VARIANTS}
    for name, res in results.items():
        print(name, "errors:", res["errors"], res["summary"], res["child_output"])
        for kind, info in res["kinds"].items():
            far = info["bytes_before_allocation_range"]
            print(f"  {info['count']} x {kind}; bytes before the allocation: {far}")
            print("\n".join("    " + line for line in info["first"]))
    print("saved", recorded.save("gumbel_sanitizer", {"variants": results}, args.out))


if __name__ == "__main__":
    main()
