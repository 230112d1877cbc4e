"""Time ``gumbel_sample`` on a GPU for chapter 4's performance section; record the medians.

    PYTHONPATH=$PWD python3 scripts/time_gumbel.py [--out specfix/recorded] [--sweep]

Throughput (G logits/s = rows x vocab / median time, ``triton.testing.do_bench``) of both noise modes at
the issue-6 shapes, one row of 248,320 per call inside a CUDA graph (100 calls captured in one graph, so
the host launch is not counted), the masked kernel against the unmasked one, and torch's samplers at
256 x 151,936. ``--sweep`` also tries tile sizes and warp counts. Writes ``gumbel_perf.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfix import Fixes, gumbel, recorded  # noqa: E402
from specfix.runtime import triton  # noqa: E402

GRAPH_CALLS = 100


def inputs(rows: int, vocab: int, dtype: torch.dtype) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(rows + vocab)
    return dict(
        logits=(torch.randn(rows, vocab, generator=gen, device="cuda") * 3).to(dtype),
        expanded_idx_mapping=torch.arange(rows, dtype=torch.int32, device="cuda"),
        temperature=torch.ones(rows, device="cuda"),
        seed=torch.randint(0, 2**40, (rows,), generator=gen, device="cuda"),
        pos=torch.randint(0, 4096, (rows,), generator=gen, device="cuda"),
    )


def call(inp: dict, apply_temperature: bool = False, **kwargs):
    return lambda: gumbel.gumbel_sample(inp["logits"], inp["expanded_idx_mapping"], inp["temperature"],
                                        inp["seed"], inp["pos"], apply_temperature, **kwargs)


def median_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_us_per_call(fn) -> float:
    """GPU time per call with GRAPH_CALLS calls captured in one CUDA graph (median of 20 replays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "specfix" / "recorded"))
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    throughput = []
    for vocab in (32_000, 151_936, 248_320):
        for rows in (1, 256, 1024):
            for dname, dtype in dtypes.items():
                inp = inputs(rows, vocab, dtype)
                for noise in ("exact", "fast"):
                    ms = median_ms(call(inp, noise=noise))
                    row = dict(vocab=vocab, rows=rows, dtype=dname, noise=noise, ms=ms,
                               G_logits_per_s=rows * vocab / ms / 1e6,
                               block=gumbel.launch_config(rows, vocab)[0])
                    throughput.append(row)
                    print(row, flush=True)
                del inp
    inp = inputs(256, 151_936, torch.float32)
    x = inp["logits"]
    baselines = {
        "torch_softmax_multinomial": median_ms(lambda: torch.multinomial(torch.softmax(x, -1), 1)),
        "torch_gumbel_max": median_ms(
            lambda: (x - torch.empty_like(x).exponential_().log_()).argmax(-1)),
        "specfix_exact": median_ms(call(inp, noise="exact")),
        "specfix_fast": median_ms(call(inp, noise="fast")),
        "specfix_exact_apply_temperature": median_ms(call(inp, True, noise="exact")),
    }
    print("256 x 151,936 fp32, ms:", baselines, flush=True)
    mask = {}
    for noise in ("exact", "fast"):
        pairs = [(median_ms(call(inp, noise=noise)),
                  median_ms(call(inp, noise=noise, fixes=Fixes(mask_invalid_reqs=False)))) for _ in range(5)]
        mask[noise] = dict(masked_ms=statistics.median(a for a, _ in pairs),
                           unmasked_ms=statistics.median(b for _, b in pairs),
                           ratio=statistics.median(a / b for a, b in pairs))
    print("mask overhead:", mask, flush=True)
    graph = []
    for vocab in (151_936, 248_320):
        one = inputs(1, vocab, torch.float32)
        draft_logits = torch.empty(1, 1, vocab, device="cuda")
        for noise in ("exact", "fast"):
            for store in (False, True):
                extra = dict(processed_logits=draft_logits, processed_logits_col=0) if store else {}
                us = graph_us_per_call(call(one, store, noise=noise, **extra))
                graph.append(dict(vocab=vocab, noise=noise, drafter_store=store, us_per_call=us))
                print(graph[-1], flush=True)
    sweep = []
    if args.sweep:
        for noise in ("exact", "fast"):
            for block in (1024, 2048, 4096, 8192, 16384):
                for warps in (4, 8):
                    ms = median_ms(call(inp, noise=noise, block_size=block, num_warps=warps))
                    sweep.append(dict(rows=256, vocab=151_936, noise=noise, block=block, num_warps=warps,
                                      G_logits_per_s=256 * 151_936 / ms / 1e6))
                    print(sweep[-1], flush=True)
            one = inputs(1, 248_320, torch.float32)
            for block in (512, 1024, 2048):
                for warps in (2, 4):
                    us = graph_us_per_call(call(one, noise=noise, block_size=block, num_warps=warps))
                    sweep.append(dict(rows=1, vocab=248_320, noise=noise, block=block, num_warps=warps,
                                      graph_us_per_call=us))
                    print(sweep[-1], flush=True)
    path = recorded.save("gumbel_perf", {"throughput": throughput, "baselines_256x151936_fp32_ms": baselines,
                                         "mask_overhead_256x151936_fp32": mask, "graph_one_row": graph,
                                         "sweep": sweep}, args.out)
    print("saved", path)


if __name__ == "__main__":
    main()
