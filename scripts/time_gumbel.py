"""Time ``gumbel_sample`` on a GPU for chapter 4's performance section; record the medians.

    PYTHONPATH=$PWD python3 scripts/time_gumbel.py [--out specfix/recorded] [--sweep] [--sweep-only]
                                                   [--before NAME=PATH ...] [--profile]

Throughput (G logits/s = rows x vocab / median back-to-back time, L2 flushed, by the bench's timer) of
both noise modes at the issue-6 shapes, one row of 248,320 per call inside a CUDA graph (100 calls
captured in one graph, so the host launch is not counted), the masked kernel against the unmasked one
(10 interleaved repeats), and torch's samplers at 256 x 151,936. Writes ``gumbel_perf.json``.

``--sweep`` also times launch configurations (tile, warps, tiles per program, splits per row) of the fast
kernel at the issue-6 shapes the way ``specfix bench`` does (L2 flushed, CUDA events around each call), checks
their tokens against the torch reference (exact noise), and writes ``gumbel_sweep_h200.json``
(``gumbel_sweep_before_after_h200.json`` with ``--before``);
``--before NAME=PATH`` (repeatable) adds an older ``gumbel.py`` (e.g. ``git show REV:specfix/mrv2/gumbel.py``)
to compare against, as ``before: NAME``.
``--sweep-only`` skips the recording. ``scripts/profile_gumbel.py`` profiles the same kernels with ncu.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfix import Fixes
from specfix.lab.masked_gumbel import gumbel_batch  # noqa: E402
from specfix.mrv2 import gumbel
from specfix.mrv2 import gumbel_reference as ref  # noqa: E402
from specfix.runtime import triton  # noqa: E402
from specfix.timing import Settings, Timer  # noqa: E402
from specfix.tools import recorded  # noqa: E402
from specfix.tools.bench.gumbel_cases import torch_gumbel_max, torch_softmax_multinomial  # noqa: E402

GRAPH_CALLS = 100
TIMER = Timer(Settings(torch.device("cuda"), "full"))


def inputs(rows: int, vocab: int, dtype: torch.dtype) -> dict:
    return gumbel_batch(rows, vocab, dtype=dtype, seed=rows + vocab, device="cuda")


def call(inp: dict, apply_temperature: bool = False, is_drafting: bool = False, **kwargs):
    args = [inp[k] for k in ("logits", "expanded_idx_mapping", "temperature", "seed", "pos")]
    return functools.partial(gumbel.gumbel_sample, *args, apply_temperature, is_drafting, **kwargs)


def median_ms(fn) -> float:
    """Back-to-back per-call time, L2 flushed (as ``triton.testing.do_bench`` takes it), in ms."""
    return statistics.median(TIMER.time(fn, shield=False)) / 1e3


def graph_us_per_call(fn) -> float:
    """GPU time per call with GRAPH_CALLS calls captured in one CUDA graph."""
    return statistics.median(TIMER.time_in_graph(fn, GRAPH_CALLS))


def flushed_us(fn) -> float:
    """GPU time of one call as ``specfix bench`` takes it: L2 flushed, the host's launch hidden."""
    return statistics.median(TIMER.time(fn))


SWEEP_SHAPES = (
    (64, 151_936),
    (256, 32_000),
    (256, 151_936),
    (256, 248_320),
    (1024, 32_000),
    (1024, 151_936),
    (1024, 248_320),
)
FEW_ROW_SHAPES = ((1, 151_936), (1, 248_320), (8, 32_000), (8, 151_936), (64, 32_000), (128, 151_936))


def configs(rows: int, vocab: int):
    """(name, gumbel_sample keyword overrides) of the candidate launch configurations."""
    yield "default", {}
    if rows < 256:  # split rows: how many programs in all, of which tile and warps
        for block, warps in ((512, 1), (1024, 1), (1024, 2), (1024, 4), (2048, 4), (2048, 8), (4096, 8)):
            tiles = triton.cdiv(vocab, block)
            for programs in (128, 256, 512, 1024):
                splits = min(tiles, triton.cdiv(programs, rows))
                yield (
                    f"{programs} programs b{block} w{warps}",
                    dict(block_size=block, num_warps=warps, tiles_per_program=triton.cdiv(tiles, splits)),
                )
        return
    row_layouts = (
        (512, 1),
        (1024, 1),
        (1024, 2),
        (2048, 2),
        (2048, 4),
        (4096, 4),
        (2048, 8),
        (4096, 8),
        (8192, 8),
        (8192, 16),
    )
    for block, warps in row_layouts:
        yield (
            f"row per program b{block} w{warps}",
            dict(block_size=block, num_warps=warps, tiles_per_program=triton.cdiv(vocab, block)),
        )
    for splits in (2, 4, 8, 16):
        for block, warps in (
            (512, 1),
            (1024, 1),
            (1024, 2),
            (2048, 2),
            (2048, 4),
            (4096, 4),
            (4096, 8),
            (8192, 8),
        ):
            tiles = triton.cdiv(vocab, block)
            yield (
                f"{splits} splits b{block} w{warps}",
                dict(block_size=block, num_warps=warps, tiles_per_program=triton.cdiv(tiles, splits)),
            )


def load_before(path: str):
    spec = importlib.util.spec_from_file_location("gumbel_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def before_call(before, inp: dict):
    """A call of the older module's gumbel_sample (fast noise, default launch) on ``inp``."""
    args = [inp[k] for k in ("logits", "expanded_idx_mapping", "temperature", "seed", "pos")]
    return functools.partial(before.gumbel_sample, *args, False, noise="fast")


def sweep(out_dir: Path, before_paths: list[str]) -> dict:
    """Candidate launch configurations at the issue-6 shapes; tokens checked against the reference first.
    ``before_paths``: ``NAME=PATH`` of older kernels to time beside them."""
    started = time.perf_counter()
    befores = {b.split("=", 1)[0]: load_before(b.split("=", 1)[1]) for b in before_paths}
    name = "gumbel_sweep_before_after_h200" if befores else "gumbel_sweep_h200"
    report = {
        "meta": recorded.gpu_meta(name),
        "checks": [],
        "configs": [],
        "graph_one_row": [],
        "context": {},
    }
    path = Path(out_dir) / f"{name}.json"

    def save():
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        path.write_text(json.dumps(report, indent=1))

    # 1. the compiled kernel picks the reference's tokens (exact noise) in each program layout
    checked = (
        "default",
        "256 programs b1024 w4",
        "row per program b2048 w8",
        "2 splits b2048 w4",
        "row per program b4096 w8",
        "8 splits b512 w1",
        "512 programs b2048 w8",
    )
    for rows, vocab, dname in ((64, 32_000, "fp32"), (16, 151_936, "bf16"), (8, 3001, "fp32")):
        inp = inputs(rows, vocab, {"fp32": torch.float32, "bf16": torch.bfloat16}[dname])
        inp["temperature"] = torch.rand(rows, device="cuda") + 0.3
        inp["temperature"][::5] = 0.0
        want = ref.gumbel_sample_reference(
            inp["logits"],
            inp["expanded_idx_mapping"],
            inp["temperature"],
            inp["seed"],
            inp["pos"],
            False,
            False,
        )
        for name, kw in configs(rows, vocab):
            if name not in checked:
                continue
            got = call(inp, noise="exact", **kw)()
            fast = call(inp, noise="fast", **kw)()
            report["checks"].append(
                dict(
                    rows=rows,
                    vocab=vocab,
                    dtype=dname,
                    config=name,
                    exact_equal=bool(torch.equal(got, want)),
                    fast_agree=float((fast == want).float().mean()),
                )
            )
        print("checked", rows, vocab, dname, all(c["exact_equal"] for c in report["checks"]), flush=True)
    save()
    # 2. throughput of each configuration, L2 flushed, as the bench takes it
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    cases = [(d, r, v) for d in dtypes for r, v in SWEEP_SHAPES + FEW_ROW_SHAPES]
    for dname, rows, vocab in cases:
        inp = inputs(rows, vocab, dtypes[dname])
        impls = [(name, call(inp, noise="fast", **kw)) for name, kw in configs(rows, vocab)]
        impls[:0] = [(f"before: {name}", before_call(before, inp)) for name, before in befores.items()]
        for name, fn in impls:
            us = flushed_us(fn)
            report["configs"].append(
                dict(
                    rows=rows,
                    vocab=vocab,
                    dtype=dname,
                    config=name,
                    us=us,
                    G_logits_per_s=rows * vocab / us / 1e3,
                )
            )
            print(
                f"{dname} {rows} x {vocab}: {name:38s} {us:8.1f} us {rows * vocab / us / 1e3:6.0f} G/s",
                flush=True,
            )
        save()
        del inp
    # 3. one row of 248,320 in a CUDA graph (GPU time per call)
    one = inputs(1, 248_320, torch.float32)
    rows_graph = [(name, call(one, noise="fast", **kw)) for name, kw in configs(1, 248_320)]
    rows_graph[:0] = [(f"before: {name}", before_call(before, one)) for name, before in befores.items()]
    for name, fn in rows_graph:
        report["graph_one_row"].append(dict(vocab=248_320, config=name, us_per_call=graph_us_per_call(fn)))
        print(report["graph_one_row"][-1], flush=True)
    # 4. context at 256 x 151,936 fp32: the read ceiling, and our kernel without noise (temperature 0)
    inp = inputs(256, 151_936, torch.float32)
    report["context"]["argmax_read_us"] = flushed_us(functools.partial(inp["logits"].argmax, -1))
    greedy = dict(inp, temperature=torch.zeros(256, device="cuda"))
    report["context"]["no_noise_default_us"] = flushed_us(call(greedy, noise="fast"))
    report["context"]["exact_default_us"] = flushed_us(call(inp, noise="exact"))
    for rows in (1, 8, 64):
        small = inputs(rows, 151_936, torch.float32)
        report["context"][f"default_fast_{rows}x151936_us"] = flushed_us(call(small, noise="fast"))
        for name, before in befores.items():
            report["context"][f"before {name}_fast_{rows}x151936_us"] = flushed_us(before_call(before, small))
    print("context:", report["context"], flush=True)
    save()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "specfix" / "recorded"))
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument(
        "--before",
        action="append",
        default=[],
        help="NAME=PATH of an older specfix gumbel.py to compare against (repeatable)",
    )
    args = parser.parse_args()
    if args.sweep or args.sweep_only:
        sweep(Path(args.out), args.before)
    if args.sweep_only:
        return
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    throughput = []
    for vocab in (32_000, 151_936, 248_320):
        for rows in (1, 256, 1024):
            for dname, dtype in dtypes.items():
                inp = inputs(rows, vocab, dtype)
                for noise in ("exact", "fast"):
                    ms = median_ms(call(inp, noise=noise))
                    row = dict(
                        vocab=vocab,
                        rows=rows,
                        dtype=dname,
                        noise=noise,
                        ms=ms,
                        G_logits_per_s=rows * vocab / ms / 1e6,
                        block=gumbel.launch_config(rows, vocab)[0],
                    )
                    throughput.append(row)
                    print(row, flush=True)
                del inp
    inp = inputs(256, 151_936, torch.float32)
    baselines = {
        "torch_softmax_multinomial": median_ms(functools.partial(torch_softmax_multinomial, inp["logits"])),
        "torch_gumbel_max": median_ms(functools.partial(torch_gumbel_max, inp["logits"])),
        "specfix_exact": median_ms(call(inp, noise="exact")),
        "specfix_fast": median_ms(call(inp, noise="fast")),
        "specfix_exact_apply_temperature": median_ms(call(inp, True, noise="exact")),
    }
    print("256 x 151,936 fp32, ms:", baselines, flush=True)
    mask = {}
    for noise in ("exact", "fast"):
        masked, unmasked = TIMER.interleaved(
            call(inp, noise=noise), call(inp, noise=noise, fixes=Fixes(mask_invalid_reqs=False)), 10
        )
        mask[noise] = dict(
            masked_ms=statistics.median(masked) / 1e3,
            unmasked_ms=statistics.median(unmasked) / 1e3,
            ratio=statistics.median(a / b for a, b in zip(masked, unmasked, strict=True)),
        )
    print("mask overhead:", mask, flush=True)
    graph = []
    for vocab in (151_936, 248_320):
        one = inputs(1, vocab, torch.float32)
        draft_logits = torch.empty(1, 1, vocab, device="cuda")
        for noise in ("exact", "fast"):
            for store in (False, True):
                extra = dict(logits_cache=draft_logits, logits_cache_col=0) if store else {}
                us = graph_us_per_call(call(one, store, noise=noise, **extra))
                graph.append(dict(vocab=vocab, noise=noise, drafter_store=store, us_per_call=us))
                print(graph[-1], flush=True)
    path = recorded.save(
        "gumbel_perf",
        {
            "throughput": throughput,
            "baselines_256x151936_fp32_ms": baselines,
            "mask_overhead_256x151936_fp32": mask,
            "graph_one_row": graph,
        },
        args.out,
    )
    print("saved", path)


if __name__ == "__main__":
    main()
