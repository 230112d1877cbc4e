"""The host side of ``specfix.mrv2.gumbel_sample``: its launch plan per shape, split-row scratch and checks.

All of it is paid per call in host time, so it is done once per shape where it can be. Read
:func:`launch_config` first (tuned with ``scripts/time_gumbel.py --sweep``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specfix.checks import check_device, check_vector, is_int
from specfix.mrv2.noise import FP_FUSION, INDEX_DTYPES, NOISE_MODES
from specfix.runtime import INTERPRET, triton
from specfix.v1 import device_checks

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
#: Registers per thread of the compiled sampling kernel. Uncapped, ptxas gave the masked kernel that stores
#: the logits more registers than the unmasked one (``gumbel_ncu_h200.json``), so fewer warps fit on an SM
#: to hide the store's latency; capped, the two get about as many (the same recording's final run). No
#: recording says whether a variant spills under the cap.
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
    """A launch of ``_gumbel_sample_kernel``, fixed by the shape and the switches: chosen once and kept."""

    grid: tuple[int, int]  # (num_tokens, num_splits)
    sizes: tuple[int, ...]  # vocab_size, num_tiles, num_full_tiles, tiles_per_program, num_splits
    #: the constexprs and compile options of an eager call (a split row's last program finishes it), of a
    #: call under graph capture (a second kernel, ``_gumbel_reduce_kernel``, does) and of that second kernel
    eager: dict
    captured: dict
    reduce: dict

    @property
    def num_splits(self) -> int:  # programs per row
        return self.grid[1]


@functools.lru_cache(maxsize=4096)
def _plan(num_tokens: int, vocab_size: int, itemsize: int, switches: tuple, overrides: tuple) -> _Plan:
    """The launch for this shape and these ``switches`` (noise, is_drafting, apply_temperature, per-token
    column, mask_invalid), ``launch_config``'s unless ``overrides`` (block_size, num_warps, tiles_per_program)
    say otherwise; ``block_size`` alone means one tile per program."""
    noise, is_drafting, apply_temperature, per_token_col, mask_invalid = switches
    block_size, num_warps, tiles_per_program = overrides
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
    eager = dict(
        IS_DRAFTING=is_drafting,
        APPLY_TEMPERATURE=apply_temperature,
        PER_TOKEN_COL=per_token_col,
        MASK_INVALID=mask_invalid,
        NOISE=NOISE_MODES.index(noise),
        USE_ASM=not INTERPRET,
        LANES=lanes,
        DEPTH=depth,
        SPLITS=splits_bound,
        ARRIVE=num_splits > 1,
        STATIC_TILES=tiles_per_program if INTERPRET else 0,
        num_warps=warps,
        **FP_FUSION[noise],
        **_REGISTER_CAP,
    )
    sizes = (vocab_size, num_tiles, vocab_size // block, tiles_per_program, num_splits)
    captured, reduce = {**eager, "ARRIVE": False}, dict(SPLITS=splits_bound, num_warps=1)
    return _Plan((num_tokens, num_splits), sizes, eager, captured, reduce)


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


# -- validation: said once, before anything is launched -------------------------------------------------

_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _validate(logits, mapping, temperature, seed, pos, cache, col, source, use_fp64, noise, block, tiles):
    """Refuse bad input before any launch: dtypes, shapes and devices always; values (a host sync on a GPU,
    impossible in a CUDA graph) only where ``device_checks`` wants them."""
    plain = cache is None and col is None and source is None and block is None and tiles is None
    if not (plain and _plainly_valid(logits, mapping, temperature, seed, pos, use_fp64, noise)):
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
        if use_fp64:
            raise ValueError("use_fp64=True is not supported: specfix reduces in float32, vLLM's default")
        # ints only, before they key the plan's cache (where 16.0 would find the plan of 16)
        if block is not None and not is_int(block):
            raise ValueError(f"block_size must be a power of two >= 16, got {block!r}")
        if tiles is not None and not is_int(tiles):
            raise ValueError(f"tiles_per_program must be a positive int, got {tiles!r}")
        _check_structure(logits, mapping, temperature, seed, pos, cache, col, source)
    if device_checks.wanted(logits):
        _check_values(mapping, temperature, col, cache, logits.shape[0])


def _plainly_valid(logits, mapping, temperature, seed, pos, use_fp64, noise) -> bool:
    """The serving call (no cache, no override) accepted in one expression, a few microseconds where the
    checks below take several times that; False sends it through them, which name what is wrong (a test
    feeds both paths the same calls: they must agree)."""
    same_type = type(logits) is type(mapping) is type(temperature) is type(seed) is type(pos) is torch.Tensor
    if not (same_type and logits.dim() == 2):
        return False
    rows, device = logits.shape[:1], logits.device
    return (
        not use_fp64
        and noise in NOISE_MODES
        and logits.dtype in _LOGIT_DTYPES
        and logits.shape[1] > 0
        and logits.stride()[1] == 1
        and mapping.dtype in INDEX_DTYPES
        and pos.dtype in INDEX_DTYPES
        and temperature.dtype == torch.float32
        and seed.dtype == torch.int64
        and mapping.shape == pos.shape == rows
        and temperature.dim() == 1
        and seed.shape == temperature.shape
        and mapping.is_contiguous()
        and pos.is_contiguous()
        and temperature.is_contiguous()
        and seed.is_contiguous()
        and mapping.device == pos.device == temperature.device == seed.device == device
    )


def _check_structure(logits, mapping, temperature, seed, pos, cache, col, source) -> None:
    """Each argument's dtype, shape and device in turn, raising on the first that fails with its name."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, float16 or bfloat16; got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [num_tokens, vocab_size], got shape {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError("logits has an empty vocabulary (vocab_size 0)")
    if logits.stride(1) != 1:
        raise ValueError(f"logits rows must be contiguous (last stride 1), got strides {logits.stride()}")
    check_vector("expanded_idx_mapping", mapping, INDEX_DTYPES, logits.shape[0], contiguous=True)
    check_vector("temperature", temperature, (torch.float32,), contiguous=True)
    check_vector("seed", seed, (torch.int64,), contiguous=True)
    check_vector("pos", pos, INDEX_DTYPES, logits.shape[0], contiguous=True)
    if temperature.shape != seed.shape:
        raise ValueError(
            "temperature and seed are per-request tables of one length; "
            f"got {temperature.shape[0]} and {seed.shape[0]}"
        )
    tensors = [("expanded_idx_mapping", mapping), ("temperature", temperature), ("seed", seed), ("pos", pos)]
    if cache is not None:
        tensors += _check_cache(cache, col, source, logits, temperature.shape[0])
    elif col is not None or source is not None:
        raise ValueError("logits_cache_col and logits_cache_source need logits_cache")
    for name, t in tensors:
        check_device(name, t, logits.device, "logits")


def _check_cache(cache, col, source, logits, num_reqs: int) -> list[tuple[str, torch.Tensor]]:
    """The draft-logits cache, its column and its source; the tensors among them, by name."""
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"logits_cache must be a torch.Tensor, got {type(cache).__name__}")
    vocab_size = logits.shape[1]
    if cache.dim() != 3 or cache.shape[2] < vocab_size:
        raise ValueError(
            f"logits_cache must have shape [max_num_reqs, num_cols, >= {vocab_size}]; "
            f"got {tuple(cache.shape)}"
        )
    if cache.shape[0] != num_reqs:
        raise ValueError(f"logits_cache has {cache.shape[0]} request rows but temperature has {num_reqs}")
    if cache.stride(2) != 1:
        raise ValueError(f"logits_cache must have last stride 1, got strides {cache.stride()}")
    tensors = [("logits_cache", cache)]
    if source is not None:
        if not isinstance(source, torch.Tensor) or source.shape != logits.shape or source.stride(1) != 1:
            raise ValueError(
                "logits_cache_source must be a tensor of logits' shape "
                f"{tuple(logits.shape)} with last stride 1"
            )
        tensors.append(("logits_cache_source", source))
    src_dtype = logits.dtype if source is None else source.dtype
    if cache.dtype != src_dtype:  # the cache holds the source's values as they are (vLLM 0.33)
        raise TypeError(
            f"logits_cache ({cache.dtype}) must have the dtype of the logits it caches, "
            f"{'logits_cache_source' if source is not None else 'logits'} ({src_dtype})"
        )
    if isinstance(col, torch.Tensor):
        length = None if col.dim() == 0 else logits.shape[0]
        check_vector(
            "logits_cache_col", col.view(1) if length is None else col, INDEX_DTYPES, length, contiguous=True
        )
        tensors.append(("logits_cache_col", col))
    elif col is not None:
        if not is_int(col):
            raise TypeError(f"logits_cache_col must be an int or an int tensor, got {type(col).__name__}")
        if not 0 <= col < cache.shape[1]:
            raise ValueError(f"logits_cache_col={col} outside [0, {cache.shape[1]})")
    return tensors


def _check_values(expanded_idx_mapping, temperature, col, cache, num_tokens: int) -> None:
    """What only the tensors' values can say: temperatures, request rows and cache columns in range."""
    if temperature.numel() and not bool((temperature >= 0).all()):  # NaN is refused too
        bad = temperature[~(temperature >= 0)][:4].tolist()
        raise ValueError(f"temperature must be >= 0 (0 means greedy); got {bad}")
    if num_tokens and bool((expanded_idx_mapping >= temperature.shape[0]).any()):
        raise ValueError(
            f"expanded_idx_mapping holds {expanded_idx_mapping.max().item()}, beyond the "
            f"{temperature.shape[0]} request-state rows"
        )
    if isinstance(col, torch.Tensor) and num_tokens and bool(((col < 0) | (col >= cache.shape[1])).any()):
        raise ValueError(f"logits_cache_col must lie in [0, {cache.shape[1]})")
