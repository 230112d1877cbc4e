"""specfix's ``noise="vllm"`` beside vLLM 0.33's own ``gumbel_sample``: the same tokens from the same inputs.

    PYTHONPATH=$PWD python3 scripts/compare_vllm_noise.py [--peer .peer] [--out DIR] [--rows-per-case N]

Needs vLLM's sampler in ``.peer/`` (``../shared/peer/fetch-vllm-sampler.sh``; it is never committed). Each
case is one vocabulary, logits dtype, temperature applied or not, drafting flag and drafter cache or not;
its batch has random logits, request slots in shuffled order with a few padded rows (-1), temperatures
from greedy to 10 (one per request), seeds over the whole int64 range and positions up to 2**40. Both
kernels run on the same tensors and every row's tokens are compared. On a GPU the drafter-cache cases give
vLLM its ``logits_cache`` with a column per row, as its drafters do (0.33 then mixes the column into the
seed); in Triton's interpreter, where vLLM's masked cache store does not run, they use one column for the
batch and hand vLLM the seeds already mixed (``seed ^ (col << 32)``). ``tests/test_gumbel.py`` runs the
interpreter version of this comparison when the peer is fetched.

Writes ``vllm_noise_comparison.json`` (device, driver, torch, triton, the peer's vLLM version, date; rows and
mismatches per case, rows whose token is not the plain argmax, the first mismatches) to ``--out``
(default: ``$OUT`` if set, else ``specfix/recorded``). Exits with status 1 if any token differs.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specfix import runtime  # noqa: E402
from specfix.mrv2 import gumbel  # noqa: E402
from specfix.tools import recorded  # noqa: E402

VERSION = "0.33.0"
#: One temperature per request, cycled: greedy, the greedy threshold itself, and a range that sampling uses.
TEMPERATURES = (0.0, 1e-5, 0.05, 0.3, 0.7, 1.0, 1.5, 2.0, 10.0)
#: Rows per request (a request's target row and its drafts' rows, as in a k = 3 verification step).
ROWS_PER_REQUEST = 4
GPU_VOCABS = (1_000, 32_000, 151_936, 248_320)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_peer(peer_dir: Path | str, version: str = VERSION):
    """vLLM's ``gumbel.py`` of ``version`` from ``peer_dir``, or None if it is not there."""
    peer_dir = Path(peer_dir)
    name = "vllm_gumbel_" + version.replace(".", "_")
    if not (peer_dir / f"{name}.py").is_file():
        return None
    if str(peer_dir) not in sys.path:
        sys.path.insert(0, str(peer_dir))
    return importlib.import_module(name)


def make_batch(rows: int, vocab: int, dtype: torch.dtype, *, seed: int, device) -> dict:
    """Inputs as vLLM passes them: logits [rows, vocab], expanded_idx_mapping int32 (shuffled request
    slots, the last rows padded with -1), temperature fp32 and seed int64 per request, pos int64 per row."""
    gen = torch.Generator().manual_seed(seed)
    num_reqs = max(1, rows // ROWS_PER_REQUEST)
    slots = torch.randperm(num_reqs, generator=gen)
    idx = slots.repeat_interleave(ROWS_PER_REQUEST)[:rows]
    idx = torch.cat([idx, slots[: rows - len(idx)]]).to(torch.int32)
    idx[-max(1, rows // 50):] = -1  # padded rows
    temps = torch.tensor(TEMPERATURES)[torch.arange(num_reqs) % len(TEMPERATURES)]
    start = torch.randint(0, 2**40, (num_reqs,), generator=gen)
    pos = start.repeat_interleave(ROWS_PER_REQUEST)[:rows]
    pos = torch.cat([pos, start[: rows - len(pos)]]) + torch.arange(rows) % ROWS_PER_REQUEST
    on_device = torch.Generator(device=device).manual_seed(seed)  # the big tensor is drawn where it lives
    scale = torch.tensor([1.0, 3.0], device=device)[torch.randint(0, 2, (rows, 1), generator=gen).to(device)]
    logits = torch.randn(rows, vocab, generator=on_device, device=device) * scale
    return dict(logits=logits.to(dtype),
                expanded_idx_mapping=idx.to(device), temperature=temps.to(device),
                seed=torch.randint(-2**63, 2**63 - 1, (num_reqs,), generator=gen).to(device),
                pos=pos.to(device))


def compare(peer, batch: dict, *, apply_temperature: bool, is_drafting: bool, cache: bool,
            cache_in_peer: bool) -> dict:
    """Run both kernels on ``batch``; the number of rows, of rows whose tokens differ, whether specfix's
    kernel stored outside its cache (a guard row each side), the rows whose token is not the plain argmax
    of the logits (the noise decided them), and the first differing rows."""
    b = batch
    rows, vocab = b["logits"].shape
    ours_extra, peer_extra, peer_seed, guarded = {}, {}, b["seed"], None
    if cache:
        shape, device = (b["temperature"].shape[0], ROWS_PER_REQUEST, vocab), b["logits"].device
        if cache_in_peer:
            col = (torch.arange(rows, device=device) % ROWS_PER_REQUEST).to(torch.int64)
            peer_extra = dict(logits_cache=torch.zeros(shape, dtype=b["logits"].dtype, device=device),
                              logits_cache_col=col)
        else:
            col = 1
            peer_seed = b["seed"] ^ (col << 32)
        buf, guarded = gumbel.guarded_table(shape, 0.0, torch.float32, device=device)
        ours_extra = dict(processed_logits=buf, processed_logits_col=col)
    args = (b["logits"], b["expanded_idx_mapping"], b["temperature"])
    theirs = peer.gumbel_sample(*args, peer_seed, b["pos"], apply_temperature, is_drafting, **peer_extra)
    ours = gumbel.gumbel_sample(*args, b["seed"], b["pos"], apply_temperature, is_drafting=is_drafting,
                                noise="vllm", **ours_extra)
    differ = (ours != theirs).nonzero().flatten().tolist()
    return dict(rows=rows, mismatches=len(differ),
                stored_outside=guarded is not None and not bool((guarded[[0, -1]] == 0).all()),
                not_argmax=int((theirs != b["logits"].float().argmax(-1)).sum()),
                first_mismatches=[dict(row=r, ours=int(ours[r]), vllm=int(theirs[r])) for r in differ[:5]])


def cases(vocabs, dtypes):
    for vocab, dname, apply_temperature, is_drafting, cache in itertools.product(
            vocabs, dtypes, (True, False), (False, True), (False, True)):
        yield dict(vocab=vocab, dtype=dname, apply_temperature=apply_temperature, is_drafting=is_drafting,
                   cache=cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=str(ROOT / ".peer"), help="the folder fetch-vllm-sampler.sh fills")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(recorded.RECORDED_DIR))
    parser.add_argument("--rows-per-case", type=int, default=2048)
    args = parser.parse_args()
    if runtime.INTERPRET:
        sys.exit("compare_vllm_noise.py compares the compiled kernels: run it on a CUDA GPU "
                 "(tests/test_gumbel.py runs the interpreter comparison)")
    peer = load_peer(args.peer)
    if peer is None:
        sys.exit(f"vLLM {VERSION}'s sampler is not in {args.peer}: run ../shared/peer/fetch-vllm-sampler.sh")
    started = time.perf_counter()
    results = []
    for i, case in enumerate(cases(GPU_VOCABS, DTYPES)):
        batch = make_batch(args.rows_per_case, case["vocab"], DTYPES[case["dtype"]], seed=i, device="cuda")
        got = compare(peer, batch, apply_temperature=case["apply_temperature"],
                      is_drafting=case["is_drafting"], cache=case["cache"], cache_in_peer=True)
        results.append({**case, **got})
        print({k: v for k, v in results[-1].items() if k != "first_mismatches"}, flush=True)
        del batch
    total = sum(r["rows"] for r in results)
    mismatches = sum(r["mismatches"] + r["stored_outside"] for r in results)
    path = recorded.save("vllm_noise_comparison", {
        "what": f"specfix gumbel_sample(noise='vllm') against vLLM {VERSION}'s gumbel_sample, same inputs",
        "vllm_version": VERSION, "temperatures": list(TEMPERATURES), "rows": total, "mismatches": mismatches,
        "not_argmax": sum(r["not_argmax"] for r in results),
        "seconds": round(time.perf_counter() - started, 1), "cases": results}, args.out)
    print(f"{total:,} rows, {mismatches} differing tokens; wrote {path}")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
