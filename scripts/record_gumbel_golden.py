"""Record golden outputs of the compiled ``gumbel_sample`` (exact noise) on a GPU for the CPU tests.

    PYTHONPATH=$PWD python3 scripts/record_gumbel_golden.py [--out tests/golden]

Writes ``gumbel_golden.pt``: for each case of ``golden_cases()`` (inputs rebuilt from integer hashes, so
every machine makes the same ones) the tokens and, once, the noise itself; plus device/driver/versions/date.
``tests/test_gumbel.py`` replays every case in Triton's interpreter and demands the same bits. The
draft-logits cache a case fills is a copy of its logits before temperature (vLLM 0.33's contract), so the
test checks it against ``expected_cache`` on every device instead of recording it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfix import runtime  # noqa: E402
from specfix.mrv2 import gumbel
from specfix.mrv2 import gumbel_reference as ref  # noqa: E402
from specfix.tools import recorded

SENTINEL = -777.0


def hashed_logits(rows: int, vocab: int, salt: int, dtype: torch.dtype) -> torch.Tensor:
    """Deterministic logits on every machine: an integer hash, mapped to [-6, 6) with a few spikes."""
    key = ref.row_key(torch.full((rows,), salt, dtype=torch.int64), torch.arange(rows, dtype=torch.int64))
    u = ref.bits_to_uniform(ref.token_bits(key, vocab))
    x = (u - 0.5) * 12.0
    x = torch.where(u > 0.9995, x + 4.0, x)
    return x.to(dtype)


def golden_cases() -> list[dict]:
    """Inputs of the golden cases (CPU tensors); the kernel sees ``logits[:, :vocab]``."""
    cases = []
    # The drafter's call: temperature applied, logits cached at column 1, two padded (-1) rows.
    # Every live row owns its own (request, column) slot, as in vLLM: two rows storing into one slot race.
    cases.append(
        dict(
            name="fp32_store_padded",
            logits=hashed_logits(10, 3001, 1, torch.float32),
            vocab=3001,
            expanded_idx_mapping=torch.tensor([3, 0, 2, 1, 5, 4, 7, 6, -1, -1], dtype=torch.int32),
            temperature=torch.tensor([1.0, 0.0, 0.6, 1.7, 1.0, 0.9, 2.0, 0.4]),
            seed=torch.tensor([7, -3, 2**40 + 5, 123456789, 7, 8, 9, 10]),
            pos=torch.tensor([5, 5, 9, 100, 6, 6, 10, 101, 0, 0]),
            apply_temperature=True,
            cache_shape=(8, 2, 3001),
            logits_cache_col=1,
        )
    )
    # The target sampler's call: bf16 logits, temperature already applied, a vocabulary of several tiles.
    cases.append(
        dict(
            name="bf16_target",
            logits=hashed_logits(6, 20011, 2, torch.bfloat16),
            vocab=20011,
            expanded_idx_mapping=torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int64),
            temperature=torch.tensor([1.0, 0.8, 0.0, 1.0, 2.5, 0.3]),
            seed=torch.arange(6, dtype=torch.int64) * 31,
            pos=torch.tensor([0, 1, 2, 3, 2**33 + 4, 5]),
            apply_temperature=False,
            cache_shape=None,
            logits_cache_col=None,
        )
    )
    # fp16 logits, a per-token column (DFlash's layout) into an fp16 cache, strided logits rows.
    cases.append(
        dict(
            name="fp16_strided_per_token_col",
            logits=hashed_logits(5, 1200, 3, torch.float16),
            vocab=1000,
            expanded_idx_mapping=torch.tensor([1, 1, 0, 0, -1], dtype=torch.int32),
            temperature=torch.tensor([0.9, 1.3]),
            seed=torch.tensor([11, 12]),
            pos=torch.tensor([40, 41, 7, 8, 0], dtype=torch.int32),
            apply_temperature=True,
            cache_shape=(2, 2, 1000),
            logits_cache_col=torch.tensor([0, 1, 0, 1, 0], dtype=torch.int32),
        )
    )
    return cases


def run_case(case: dict, device) -> dict:
    """Run one case on ``device``; returns the tokens and the cache (sentinel-filled beforehand)."""
    args = {
        k: (v.to(device) if isinstance(v, torch.Tensor) else v)
        for k, v in case.items()
        if k in ("logits", "expanded_idx_mapping", "temperature", "seed", "pos", "logits_cache_col")
    }
    args["logits"] = args["logits"][:, : case["vocab"]]  # a narrower view: rows keep the wider stride
    cache = whole = None
    if case["cache_shape"] is not None:  # a guard row each side: a stray store lands there
        cache, whole = gumbel.guarded_table(
            case["cache_shape"], SENTINEL, case["logits"].dtype, device=device
        )
    tokens = gumbel.gumbel_sample(
        args["logits"],
        args["expanded_idx_mapping"],
        args["temperature"],
        args["seed"],
        args["pos"],
        case["apply_temperature"],
        False,
        cache,
        args.get("logits_cache_col"),
    )
    if whole is not None and not bool((whole[[0, -1]] == SENTINEL).all()):
        raise AssertionError(f"{case['name']}: a row stored outside the draft-logits cache")
    return {"tokens": tokens.cpu(), "cache": None if cache is None else cache.cpu()}


def expected_cache(case: dict) -> torch.Tensor:
    """What ``run_case`` leaves in the cache: each valid row's logits at ``[req_state_idx, col]``, as they are
    (no two valid rows of a case share a cell); the sentinel elsewhere."""
    cache = torch.full(case["cache_shape"], SENTINEL, dtype=case["logits"].dtype)
    cols = torch.as_tensor(case["logits_cache_col"]).expand(len(case["pos"]))
    for row, (slot, col) in enumerate(zip(case["expanded_idx_mapping"].tolist(), cols.tolist(), strict=True)):
        if slot >= 0:
            cache[slot, col] = case["logits"][row, : case["vocab"]]
    return cache


def noise_case() -> dict:
    return dict(
        seed=torch.tensor([0, 1, -1, 2**62 + 17]), pos=torch.tensor([0, 1, 2**31 + 3, 99]), vocab=4099
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "golden"))
    args = parser.parse_args()
    if runtime.INTERPRET:
        sys.exit("record_gumbel_golden.py records the compiled kernel: run it on a CUDA GPU")
    results = {case["name"]: {"tokens": run_case(case, "cuda")["tokens"]} for case in golden_cases()}
    nc = noise_case()
    noise = gumbel.gumbel_noise(nc["seed"].cuda(), nc["pos"].cuda(), nc["vocab"]).cpu()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gumbel_golden.pt"
    # plain str (the source hashes a dict of str): loadable with weights_only
    meta = {k: v if isinstance(v, dict) else str(v) for k, v in recorded.gpu_meta("gumbel_golden").items()}
    torch.save({"meta": meta, "cases": results, "noise": noise}, path)
    print(f"wrote {path}: " + ", ".join(f"{k} tokens {v['tokens'].tolist()}" for k, v in results.items()))


if __name__ == "__main__":
    main()
