"""Chapter 4's experiments: the Gumbel sampler on shared logits, in crowds, between guard rows, padded.

Read :func:`gumbel_batch` (the one input builder), then :func:`run_drafter_step`: a ``-1`` row's access one
row before a table lands in a guard row we can inspect. :func:`stale_padding_step` is chapter 3's other
half: stale indices are ``>= 0``, so the mask cannot catch them.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specfix import runtime
from specfix.fixes import Fixes
from specfix.mrv2 import gumbel
from specfix.mrv2 import gumbel_reference as ref

#: What every guarded draft-logits buffer holds before a step: any other value was written by the kernel.
SENTINEL = -777.0
#: The keys of a batch: ``gumbel_sample``'s tensor arguments.
BATCH_KEYS = ("logits", "expanded_idx_mapping", "temperature", "seed", "pos")


def gumbel_batch(
    rows: int,
    vocab: int,
    *,
    num_reqs: int | None = None,
    temperature=1.0,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    scale: float = 3.0,
    logits: torch.Tensor | None = None,
    first_pos: int | None = 0,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """The one builder of ``gumbel_sample``'s inputs in vLLM 0.33's layout: row i is request
    ``i % num_reqs`` at position ``first_pos + i // num_reqs``."""
    num_reqs = num_reqs or rows
    if rows < 1 or vocab < 1 or num_reqs < 1:
        raise ValueError(f"rows, vocab and num_reqs must be >= 1, got {rows}, {vocab} and {num_reqs}")
    gen = torch.Generator().manual_seed(seed)
    on_device = (
        gen if torch.device(device).type == "cpu" else torch.Generator(device=device).manual_seed(seed)
    )
    if logits is None:
        logits = torch.randn(rows, vocab, generator=on_device, device=device).mul_(scale)
    elif logits.shape != (vocab,):
        raise ValueError(f"logits must be one row [vocab], got shape {tuple(logits.shape)} (vocab={vocab})")
    temps = torch.as_tensor(temperature, dtype=torch.float32)
    index = torch.arange(rows)
    pos = (
        index // num_reqs + first_pos
        if first_pos is not None
        else torch.randint(0, 1 << 20, (rows,), generator=gen)
    )
    return dict(
        logits=logits.expand(rows, vocab).to(device=device, dtype=dtype).contiguous(),
        expanded_idx_mapping=(index % num_reqs).to(device),
        temperature=(temps.expand(num_reqs) if temps.dim() == 0 else temps).contiguous().to(device),
        seed=torch.randint(-(2**62), 2**62, (num_reqs,), generator=gen).to(device),
        pos=pos.to(device),
    )


def repeated_rows(
    rows: int,
    logits: torch.Tensor,
    temperature: float,
    num_reqs: int = 8,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """``rows`` rows that all hold ``logits`` (``[vocab]``): row i is request ``i % num_reqs`` at position
    ``i // num_reqs``, each request with its own random seed. Every row is one independent draw."""
    return gumbel_batch(
        rows,
        logits.shape[0],
        num_reqs=num_reqs,
        temperature=float(temperature),
        seed=seed,
        logits=logits,
        device=device,
    )


def random_batch(
    rows: int, vocab_size: int, seed: int = 0, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """``rows`` random rows, one request each; request 0 is greedy, the rest have T in [0.3, 2]."""
    temperature = torch.rand(max(rows, 1), generator=torch.Generator().manual_seed(seed)) * 1.7 + 0.3
    temperature[0] = 0.0
    return gumbel_batch(rows, vocab_size, temperature=temperature, seed=seed, first_pos=None, device=device)


#: Where ``scripts/fetch_vllm_peer.py`` puts vLLM's own sampler files (git-ignored, never shipped).
PEER_DIR = Path(__file__).resolve().parents[2] / ".peer"


def load_vllm_sampler(version: str = "0.33.0", peer_dir: Path | str | None = None, kind: str = "gumbel"):
    """vLLM's own ``vllm/v1/worker/gpu/sample/gumbel.py`` of ``version`` (or its
    ``vllm/v1/sample/rejection_sampler.py``) from ``peer_dir``; None when not fetched or without triton."""
    peer_dir = Path(PEER_DIR if peer_dir is None else peer_dir)
    name = f"vllm_{kind}_" + version.replace(".", "_")
    if not runtime.HAS_TRITON or not (peer_dir / f"{name}.py").is_file():
        return None
    if str(peer_dir) not in sys.path:
        sys.path.insert(0, str(peer_dir))
    module = importlib.import_module(name)
    sample = getattr(module, "gumbel_sample", None)
    if runtime.INTERPRET and sample is not None and not hasattr(sample, "__wrapped__"):
        module.gumbel_sample = _with_int1_store_masks(sample)
    return module


def _with_int1_store_masks(fn):
    """``fn`` with the interpreter reading store masks as int1, as a GPU does: triton 3.6 to 3.9 widen
    vLLM's ``mask & is_valid_req`` to a dtype they then refuse."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    store = InterpreterBuilder.create_masked_store

    def as_int1(self, ptrs, value, mask, cache_policy):
        return store(self, ptrs, value, TensorHandle(mask.data.astype(bool), mask.dtype), cache_policy)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        InterpreterBuilder.create_masked_store = as_int1
        try:
            return fn(*args, **kwargs)
        finally:
            InterpreterBuilder.create_masked_store = store

    return run


def vllm_mode_agreement(batch: dict, peer=None) -> list[dict]:
    """``noise="vllm"`` beside vLLM 0.33's ``gumbel_sample`` (None: a torch reference) and specfix's
    ``exact`` mode, sampled as a drafter samples: same tokens, same caches, per drafting flag."""
    args, col = [batch[k] for k in BATCH_KEYS], 1  # col: the draft-logits column the rows cache into
    shape = (batch["temperature"].shape[0], col + 1, batch["logits"].shape[1])
    rows = []
    for drafting in (False, True):
        ours, theirs = (torch.zeros(shape, dtype=batch["logits"].dtype, device=args[0].device) for _ in "ab")
        mine = gumbel.gumbel_sample(*args, True, drafting, ours, col, noise="vllm").cpu()
        if peer is not None:
            other = peer.gumbel_sample(*args, True, drafting, theirs, torch.tensor(col, device=ours.device))
        else:
            other = ref.gumbel_sample_reference(*args, True, drafting, theirs, col, noise="vllm")
        exact = gumbel.gumbel_sample(*args, True, drafting, torch.zeros_like(ours), col).cpu()
        rows.append(
            {
                "drafting": drafting,
                "rows": len(mine),
                "same token as vLLM's noise": int((mine == other.cpu()).sum()),
                "same cached logits": bool(torch.equal(ours, theirs)),
                "same token as specfix exact": int((mine == exact).sum()),
                "greedy row agrees": bool(mine[0] == exact[0]),
            }
        )
    return rows


def alone_and_crowded(vocab_size: int = 5000) -> tuple[dict, dict, list[int]]:
    """Four requests sampled alone, and the same four moved to other request-state slots among four
    strangers: ``(alone, crowd, rows)``, where ``crowd``'s rows ``rows`` are the four requests in order."""
    gen = torch.Generator().manual_seed(3)
    alone = dict(
        logits=torch.randn(4, vocab_size, generator=gen) * 3,
        expanded_idx_mapping=torch.arange(4),
        temperature=torch.tensor([1.0, 0.5, 2.0, 1.0]),
        seed=torch.tensor([11, 22, 33, 44]),
        pos=torch.tensor([7, 7, 8, 9]),
    )
    crowd = dict(
        logits=torch.randn(8, vocab_size, generator=gen) * 3,
        expanded_idx_mapping=torch.arange(8),
        temperature=torch.ones(8),
        seed=torch.arange(100, 108),
        pos=torch.arange(8),
    )
    rows, slots = [6, 0, 3, 5], [5, 2, 7, 0]
    for old, (row, slot) in enumerate(zip(rows, slots, strict=True)):
        crowd["logits"][row] = alone["logits"][old]
        crowd["expanded_idx_mapping"][row] = slot
        crowd["temperature"][slot] = alone["temperature"][old]
        crowd["seed"][slot] = alone["seed"][old]
        crowd["pos"][row] = alone["pos"][old]
    return alone, crowd, rows


def sample(batch: dict, device: torch.device | str = "cpu", **kwargs) -> torch.Tensor:
    """``gumbel_sample`` of ``batch`` on ``device``, temperature applied; the tokens on the CPU."""
    on = {k: batch[k].to(device) for k in BATCH_KEYS}
    return gumbel.gumbel_sample(**on, apply_temperature=True, **{"is_drafting": False, **kwargs}).cpu()


@dataclass(frozen=True)
class DrafterStep:
    """One drafter step's sampler inputs: ``rows`` logit rows (live rows first, then padding) and the
    request-state tables, plus what the guard rows around the temperature and seed tables hold."""

    logits: torch.Tensor  # [rows, vocab] float32
    expanded_idx_mapping: torch.Tensor  # [rows] int64, -1 for a padded row
    pos: torch.Tensor  # [rows] int64
    temperature: torch.Tensor  # [max_num_reqs] float32
    seed: torch.Tensor  # [max_num_reqs] int64
    num_cols: int  # draft steps: the columns of draft_logits
    col: int  # the column this step writes
    guard_temperature: float
    guard_seed: int

    @property
    def live_slots(self) -> list[tuple[int, int]]:
        """(request-state row, column) of every cell the live rows write."""
        idx = self.expanded_idx_mapping
        return [(int(r), self.col) for r in idx[idx >= 0]]


def padded_drafter_step() -> DrafterStep:
    """The chapter's example: 4 live rows in 4 request slots (one greedy), then 2 padded rows (``-1``)
    sharing one set of logits, so that both write the same values wherever they write."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 600, generator=gen) * 3
    logits[5] = logits[4]
    return DrafterStep(
        logits=logits,
        expanded_idx_mapping=torch.tensor([2, 0, 3, 1, -1, -1]),
        pos=torch.tensor([4, 5, 6, 7, 0, 0]),
        temperature=torch.tensor([1.0, 0.6, 0.0, 1.5]),
        seed=torch.tensor([1, 2, 3, 4]),
        num_cols=2,
        col=1,
        guard_temperature=2.0,
        guard_seed=12345,
    )


def run_drafter_step(step: DrafterStep, fixes: Fixes | None = None, device: torch.device | str = "cpu"):
    """Sample ``step`` on tables with a :data:`SENTINEL` guard row on each side; ``(tokens, buffers)``
    with the whole guarded allocations, on the CPU."""
    max_reqs, vocab = step.temperature.shape[0], step.logits.shape[1]
    temperature, temp_whole = gumbel.guarded_table(
        (max_reqs,), 0.0, torch.float32, guard_fill=step.guard_temperature, device=device
    )
    temperature.copy_(step.temperature)
    seed, seed_whole = gumbel.guarded_table(
        (max_reqs,), 0, torch.int64, guard_fill=step.guard_seed, device=device
    )
    seed.copy_(step.seed)
    draft_logits, whole = gumbel.guarded_table(
        (max_reqs, step.num_cols, vocab), SENTINEL, torch.float32, device=device
    )
    tokens = gumbel.gumbel_sample(
        step.logits.to(device),
        step.expanded_idx_mapping.to(device),
        temperature,
        seed,
        step.pos.to(device),
        True,
        True,
        draft_logits,
        step.col,
        fixes=fixes,
    )
    return tokens.cpu(), {
        "draft_logits": whole.cpu(),
        "temperature": temp_whole.cpu(),
        "seed": seed_whole.cpu(),
    }


def stale_padding_step(seed: int, device: torch.device | str = "cpu") -> tuple[dict, list[int]]:
    """``(puzzle, overwritten)``: a draft-logits table after 5 requests, 2 finished, then 3 live rows padded
    to 6 whose padded rows kept stale slots; the padded write lands last (GPU: a race), overwriting one."""
    gen = torch.Generator().manual_seed(seed)
    max_reqs, num_cols, vocab, live_rows = 8, 3, 40, 3
    while True:
        previous = torch.randperm(max_reqs, generator=gen)[:6]
        live = previous[torch.randperm(5, generator=gen)[:live_rows]]  # 3 of the 5 that ran before
        stale = previous[3:6]
        overwritten = sorted(set(live.tolist()) & set(stale.tolist()))
        if len(overwritten) == 1:
            break
    temperature = torch.tensor([0.7, 1.2, 1.3, 0.5, 2.0, 0.9, 1.6, 0.8])
    temperature = temperature[torch.randperm(max_reqs, generator=gen)]
    greedy = next(int(s) for s in live if int(s) not in overwritten)
    temperature[greedy] = 0.0  # one live request is greedy
    table = torch.randn(max_reqs, num_cols, vocab, generator=gen) * 3  # what earlier steps left there
    logits = torch.randn(6, vocab, generator=gen) * 3
    col = int(torch.randint(0, num_cols, (1,), generator=gen))
    idx = torch.cat([live, stale])
    pos = torch.arange(6) + 10
    seeds, on_device = torch.arange(max_reqs), table.to(device)
    for rows in (slice(0, live_rows), slice(live_rows, 6)):  # live rows first, padded rows last
        gumbel.gumbel_sample(
            logits[rows].to(device),
            idx[rows].to(device),
            temperature.to(device),
            seeds.to(device),
            pos[rows].to(device),
            True,
            True,
            on_device,
            col,
        )
    puzzle = {
        "table": on_device.cpu(),
        "col": col,
        "logits": logits[:live_rows].clone(),
        "idx_mapping": idx[:live_rows].clone(),
        "temperature": temperature,
    }
    return puzzle, overwritten
