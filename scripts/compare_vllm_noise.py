"""specfix's ``noise="vllm"`` beside vLLM 0.33's own ``gumbel_sample``: the same tokens and the same cached
logits from the same inputs.

    PYTHONPATH=$PWD python3 scripts/compare_vllm_noise.py [--peer .peer] [--out DIR] [--rows-per-case N]

Needs vLLM's sampler in ``.peer/`` (``scripts/fetch_vllm_peer.py``; it is never committed). Each case is
one vocabulary, logits dtype (fp32, bf16, fp16), temperature applied or not, drafting flag and draft-logits
cache (none, one column for the step as vLLM's draft-model speculator passes it, or a column per row as
DFlash does); its batch (``gumbel_batch``) has random logits, request slots in shuffled order with a few
padded rows (-1),
one temperature per request from ``TEMPERATURES`` (greedy, the tiny ones vLLM's ``SamplingParams`` would
have raised to 0.01, up to 10), seeds over the whole int64 range and positions up to 2**40. Both kernels run
on the same tensors; every row's token is compared, and every cache (both start as the same sentinel) value
for value. ``tests/test_gumbel.py`` runs this comparison in Triton's interpreter when the peer is fetched.

Writes ``vllm_noise_comparison.json`` (device, driver, torch, triton, date, commit and source hashes by
``specfix.tools.recorded``; the peer's vLLM version; rows, token and cache mismatches per case, rows whose
token is not the plain argmax, the first mismatches) to ``--out`` (default: ``$OUT`` if set, else
``specfix/recorded``). Exits with status 1 if anything differs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfix import runtime  # noqa: E402
from specfix.lab.masked_gumbel import gumbel_batch, load_vllm_sampler  # noqa: E402
from specfix.mrv2 import gumbel  # noqa: E402
from specfix.tools import recorded  # noqa: E402

VERSION = "0.33.0"
#: One temperature per request, cycled from a per-batch offset: greedy, three below vLLM's _SAMPLING_EPS
#: or at it (its SamplingParams raises them to 0.01, but its kernel samples any T != 0 given to it), and a
#: range that sampling uses.
TEMPERATURES = (0.0, 1e-7, 5e-6, 1e-5, 0.01, 0.7, 2.0, 10.0)
#: Rows per request (a request's target row and its drafts' rows, as in a k = 3 verification step).
ROWS_PER_REQUEST = 4
GPU_VOCABS = (1_000, 32_000, 151_936, 248_320)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The draft-logits cache: none, one 0-d column tensor for the whole call, or a column per row.
CACHES = (None, "step", "per row")
SENTINEL = -777.0


def make_batch(
    rows: int, vocab: int, dtype: torch.dtype, *, seed: int, device, rows_per_request: int = ROWS_PER_REQUEST
) -> dict:
    """``gumbel_batch``'s inputs laid out as vLLM 0.33 passes a verification step: each request's
    ``rows_per_request`` rows, requests in shuffled slot order, then at least ``rows // 50`` padded rows (-1);
    one temperature per request from ``TEMPERATURES``, seeds over the whole int64 range, positions from a
    random start up to 2**40."""
    gen = torch.Generator().manual_seed(seed)
    num_reqs = max(1, (rows - max(1, rows // 50)) // rows_per_request)
    temps = torch.tensor(TEMPERATURES)[(torch.arange(num_reqs) + seed) % len(TEMPERATURES)]
    batch = gumbel_batch(
        rows, vocab, num_reqs=num_reqs, temperature=temps, dtype=dtype, seed=seed, device=device
    )
    slots = torch.randperm(num_reqs, generator=gen)
    idx = slots.repeat_interleave(rows_per_request)[: rows - 1]
    idx = torch.cat([idx, torch.full((rows - len(idx),), -1)])
    start = torch.randint(0, 2**40, (num_reqs,), generator=gen)
    pos = start[idx.clamp(min=0)] + torch.arange(rows) % rows_per_request
    seeds = torch.randint(-(2**63), 2**63 - 1, (num_reqs,), generator=gen)
    return dict(batch, expanded_idx_mapping=idx.to(device), seed=seeds.to(device), pos=pos.to(device))


def compare(peer, batch: dict, *, apply_temperature: bool, is_drafting: bool, cache: str | None) -> dict:
    """Run both kernels on ``batch``; the number of rows, of rows whose tokens differ, of cache cells
    ``[slot, col]`` whose values differ, whether specfix's kernel stored outside its cache (a guard row each
    side), the rows whose token is not the plain argmax of the logits (the noise decided them), and the first
    differing rows."""
    b = batch
    rows, vocab = b["logits"].shape
    device, dtype = b["logits"].device, b["logits"].dtype
    args = (
        b["logits"],
        b["expanded_idx_mapping"],
        b["temperature"],
        b["seed"],
        b["pos"],
        apply_temperature,
        is_drafting,
    )
    guarded = ours_cache = theirs_cache = None
    extra = ()
    if cache is not None:
        shape = (b["temperature"].shape[0], ROWS_PER_REQUEST, vocab)
        col = (
            torch.tensor(2, device=device)
            if cache == "step"  # rows of a request: consecutive columns
            else torch.arange(rows, device=device) % ROWS_PER_REQUEST
        )
        ours_cache, guarded = gumbel.guarded_table(shape, SENTINEL, dtype, device=device)
        theirs_cache = torch.full(shape, SENTINEL, dtype=dtype, device=device)
        extra = (col,)
    theirs = peer.gumbel_sample(*args, *((theirs_cache,) + extra if extra else ()))
    ours = gumbel.gumbel_sample(*args, *((ours_cache,) + extra if extra else ()), noise="vllm")
    differ = (ours != theirs).nonzero().flatten().tolist()
    cells = 0 if cache is None else int((ours_cache != theirs_cache).any(-1).sum())
    return dict(
        rows=rows,
        mismatches=len(differ),
        cache_mismatches=cells,
        stored_outside=guarded is not None and not bool((guarded[[0, -1]] == SENTINEL).all()),
        not_argmax=int((theirs != b["logits"].float().argmax(-1)).sum()),
        first_mismatches=[dict(row=r, ours=int(ours[r]), vllm=int(theirs[r])) for r in differ[:5]],
    )


def cases(vocabs, dtypes):
    for vocab, dname, apply_temperature, is_drafting, cache in itertools.product(
        vocabs, dtypes, (True, False), (False, True), CACHES
    ):
        yield dict(
            vocab=vocab,
            dtype=dname,
            apply_temperature=apply_temperature,
            is_drafting=is_drafting,
            cache=cache,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=str(ROOT / ".peer"), help="the folder fetch_vllm_peer.py fills")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(recorded.RECORDED_DIR))
    parser.add_argument("--rows-per-case", type=int, default=1024)
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no case after this many seconds; the recording says how many cases ran",
    )
    args = parser.parse_args()
    if runtime.INTERPRET:
        sys.exit(
            "compare_vllm_noise.py compares the compiled kernels: run it on a CUDA GPU "
            "(tests/test_gumbel.py runs the interpreter comparison)"
        )
    peer = load_vllm_sampler(VERSION, args.peer)
    if peer is None:
        sys.exit(
            f"vLLM {VERSION}'s sampler is not in {args.peer}: run python scripts/fetch_vllm_peer.py {VERSION}"
        )
    started = time.perf_counter()
    results = []
    planned = list(cases(GPU_VOCABS, DTYPES))
    for i, case in enumerate(planned):
        if args.deadline_s is not None and time.perf_counter() - started > args.deadline_s:
            print(f"deadline: {i} of {len(planned)} cases run", flush=True)
            break
        # One row per request when the whole call caches into one column (as vLLM's draft-model speculator
        # calls it): two rows of a request would race for the same cell.
        batch = make_batch(
            args.rows_per_case,
            case["vocab"],
            DTYPES[case["dtype"]],
            seed=i,
            device="cuda",
            rows_per_request=1 if case["cache"] == "step" else ROWS_PER_REQUEST,
        )
        got = compare(
            peer,
            batch,
            apply_temperature=case["apply_temperature"],
            is_drafting=case["is_drafting"],
            cache=case["cache"],
        )
        results.append({**case, **got})
        print({k: v for k, v in results[-1].items() if k != "first_mismatches"}, flush=True)
        del batch
    total = sum(r["rows"] for r in results)
    mismatches = sum(r["mismatches"] + r["cache_mismatches"] + r["stored_outside"] for r in results)
    path = recorded.save(
        "vllm_noise_comparison",
        {
            "what": f"specfix gumbel_sample(noise='vllm') against vLLM {VERSION}'s gumbel_sample, "
            "same inputs: "
            "tokens and draft-logits caches",
            "vllm_version": VERSION,
            "temperatures": list(TEMPERATURES),
            "rows": total,
            "mismatches": sum(r["mismatches"] for r in results),
            "cache_mismatches": sum(r["cache_mismatches"] for r in results),
            "not_argmax": sum(r["not_argmax"] for r in results),
            "seconds": round(time.perf_counter() - started, 1),
            "cases_planned": len(planned),
            "cases": results,
        },
        args.out,
    )
    print(f"{total:,} rows, {mismatches} differing tokens or cache cells; wrote {path}")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
