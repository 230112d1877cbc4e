"""How ``specfix.mrv2.gumbel_sample`` lays its kernel out: host work done once per shape, not per call.

The launch configuration per shape (tuned with ``scripts/time_gumbel.py --sweep``), the tile shape, the plan
kept per shape, and the scratch of rows split over several programs. Read :func:`launch_config` first.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specfix.checks import is_int
from specfix.mrv2.noise import NOISE_MODES
from specfix.runtime import INTERPRET, triton

#: Below _FEW_ROWS rows, each row's vocabulary is split over several programs, about _PROGRAMS in all; from
#: _FEW_ROWS rows on, over _ROW_SPLITS of them (_SMALL_VOCAB_SPLITS for a vocabulary under _LARGE_VOCAB).
_FEW_ROWS = 256
_PROGRAMS = 1024
_ROW_SPLITS = 16
_SMALL_VOCAB_SPLITS = 8
_LARGE_VOCAB = 100_000
#: Up to _FEWEST_ROWS rows, _FEWEST_ROWS_SPLITS one-warp programs per row (``scripts/time_gumbel.py --sweep``
#: times one row of 248,320 in a CUDA graph under each launch configuration: ``graph_one_row``).
_FEWEST_ROWS = 4
_FEWEST_ROWS_SPLITS = 256
#: A tile is DEPTH x LANES tokens, LANES = the logits of one 16-byte load per thread, times the threads.
_BYTES_PER_LOAD = 16
#: Registers per thread the compiled sampling kernel may use. Left to itself, ptxas gave the masked kernel
#: that also stores the logits more registers than the unmasked one (the ncu profile's run before the cap,
#: ``gumbel_ncu_h200.json``, has the counts), and fewer warps then fit on an SM to hide the store's latency;
#: capped, no variant spills (ptxas -v, sm_90, triton 3.6).
_REGISTER_CAP = {} if INTERPRET else {"maxnreg": 96}


@functools.cache
def launch_config(num_tokens: int, vocab_size: int) -> tuple[int, int, int]:
    """(BLOCK, num_warps, tiles_per_program) for ``gumbel_sample``: on a GPU small programs, each row split
    over several, as the constants above say."""
    fits = max(16, triton.next_power_of_2(vocab_size))  # a tiny vocabulary needs no larger tile
    if INTERPRET:  # one program per row, tiles as large as possible: the interpreter pays per program
        block = min(fits, 1 << 16)
        return block, 4, triton.cdiv(vocab_size, block)
    if num_tokens >= _FEW_ROWS and vocab_size < _LARGE_VOCAB:
        block, warps, splits = min(512, fits), 1, _SMALL_VOCAB_SPLITS
    elif num_tokens <= _FEWEST_ROWS:
        block, warps, splits = min(512, fits), 1, _FEWEST_ROWS_SPLITS
    else:
        block, warps = min(1024, fits), 2
        splits = _ROW_SPLITS if num_tokens >= _FEW_ROWS else triton.cdiv(_PROGRAMS, num_tokens)
    tiles = triton.cdiv(vocab_size, block)
    return block, warps, triton.cdiv(tiles, min(tiles, splits))


def tile_shape(block: int, num_warps: int, itemsize: int) -> tuple[int, int]:
    """(DEPTH, LANES) of a tile: a 16-byte load per thread per tile row, so that a thread holds whole columns
    and the tile's reduction along its first axis never leaves its registers."""
    lanes = min(block, _BYTES_PER_LOAD // itemsize * 32 * num_warps)
    return block // lanes, lanes


class _Plan(NamedTuple):
    """A launch of ``_gumbel_sample_kernel``, fixed by the shape: chosen once per shape and kept."""

    grid: tuple[int, int]
    num_tiles: int
    num_full_tiles: int
    tiles_per_program: int
    num_splits: int
    num_warps: int
    depth: int
    lanes: int
    splits_bound: int
    #: the kernel's size arguments, in its order: vocab_size, num_tiles, num_full_tiles, tiles_per_program,
    #: num_splits
    sizes: tuple[int, int, int, int, int]


@functools.lru_cache(maxsize=4096)
def _plan(num_tokens: int, vocab_size: int, itemsize: int, block_size, num_warps, tiles_per_program) -> _Plan:
    """The launch for this shape, ``launch_config``'s unless overridden (``block_size`` alone means one tile
    per program)."""
    default_block, default_warps, default_tiles = launch_config(num_tokens, vocab_size)
    block = default_block if block_size is None else block_size
    if block < 16 or block & (block - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    num_tiles = triton.cdiv(vocab_size, block)
    if tiles_per_program is None:
        tiles_per_program = 1 if block_size else default_tiles
    if tiles_per_program < 1:
        raise ValueError(f"tiles_per_program must be a positive int, got {tiles_per_program!r}")
    tiles_per_program = min(tiles_per_program, num_tiles)
    num_splits = triton.cdiv(num_tiles, tiles_per_program)
    warps = num_warps or default_warps
    depth, lanes = tile_shape(block, warps, itemsize)
    splits_bound = max(64, triton.next_power_of_2(num_splits))  # a few compiled variants, not one per count
    return _Plan(
        (num_tokens, num_splits),
        num_tiles,
        vocab_size // block,
        tiles_per_program,
        num_splits,
        warps,
        depth,
        lanes,
        splits_bound,
        (vocab_size, num_tiles, vocab_size // block, tiles_per_program, num_splits),
    )


@functools.lru_cache(maxsize=1024)
def _constexprs(
    plan: _Plan,
    noise: str,
    is_drafting: bool,
    apply_temperature: bool,
    per_token_col: bool,
    mask_invalid: bool,
    arrive: bool,
) -> dict:
    """The kernel's switches and compile options for one launch (kept: building them costs host time)."""
    # The exact mode is compiled without FMA contraction (its bits are the reference's); the vllm mode as
    # vLLM's kernel is compiled (triton's default), so that the two make the same float operations.
    fusion = {} if noise == "vllm" else {"enable_fp_fusion": noise == "fast"}
    return dict(
        IS_DRAFTING=is_drafting,
        APPLY_TEMPERATURE=apply_temperature,
        PER_TOKEN_COL=per_token_col,
        MASK_INVALID=mask_invalid,
        NOISE=NOISE_MODES.index(noise),
        USE_ASM=not INTERPRET,
        LANES=plan.lanes,
        DEPTH=plan.depth,
        SPLITS=plan.splits_bound,
        ARRIVE=arrive,
        STATIC_TILES=plan.tiles_per_program if INTERPRET else 0,
        num_warps=plan.num_warps,
        **fusion,
        **_REGISTER_CAP,
    )


def _check_overrides(block_size, tiles_per_program) -> None:
    """Ints only, before they key the plan's cache (where ``16.0`` would find the plan of ``16``)."""
    if block_size is not None and not is_int(block_size):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    if tiles_per_program is not None and not is_int(tiles_per_program):
        raise ValueError(f"tiles_per_program must be a positive int, got {tiles_per_program!r}")


#: Scratch of split rows in eager calls, per (device, stream) since calls on two streams may overlap: the
#: arrival counters, which the kernel leaves at 0 (no memset), and the splits' keys, written before they are
#: read (no allocation). A captured call allocates its own keys in the graph's pool and uses no counters.
_SPLIT_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _capturing(device: torch.device) -> bool:
    """Is a CUDA graph being captured on the current stream?"""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _split_scratch(device: torch.device, rows: int, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(arrival counters, split keys) for an eager call of ``rows`` rows of ``splits`` splits each."""
    # The raw stream handle, read as triton's launcher reads it (a Stream object costs microseconds).
    key = (device, torch._C._cuda_getCurrentRawStream(device.index)) if device.type == "cuda" else (device,)
    cached = _SPLIT_SCRATCH.get(key)
    if cached is None or cached[0].numel() < rows or cached[1].numel() < rows * splits:
        rows, keys = max(rows, 1024), max(rows * splits, 16 * 1024)
        cached = _SPLIT_SCRATCH[key] = (
            torch.zeros(rows, dtype=torch.int32, device=device),
            torch.empty(keys, dtype=torch.int64, device=device),
        )
    return cached
