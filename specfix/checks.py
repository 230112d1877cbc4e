"""Argument checks said once: ints, id tensors and other 1-D tensors, devices.

Each raises TypeError (wrong kind) or ValueError (wrong value) with a message that names the argument, so
that a public function checks everything before it changes anything. These read only what the host holds
(types, dtypes, shapes); checks that read a GPU tensor's values run under :mod:`specfix.v1.device_checks`.
"""

from __future__ import annotations

import torch

#: Token-id tensors must hold signed integers: a float or unsigned tensor cannot carry ``-1``.
ID_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)


def is_int(value: object) -> bool:
    """An int and not a bool: ``True`` is an int to Python, but never a count, an id or a seed here."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(name: str, value: object, low: int = 1) -> None:
    """An int (not a bool) >= ``low``: a size, a count, a length."""
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def check_vector(
    name: str,
    tensor: object,
    dtypes: tuple[torch.dtype, ...] = ID_DTYPES,
    length: int | None = None,
    min_length: int = 0,
    contiguous: bool = False,
) -> None:
    """A 1-D tensor of one of ``dtypes``, with ``length`` entries (or at least ``min_length``), contiguous
    if asked (a kernel reads it with stride 1)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        allowed = (
            "signed integers (int32 or int64)"
            if dtypes == ID_DTYPES
            else "dtype " + " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        )
        raise TypeError(f"{name} must hold {allowed}, got {tensor.dtype}")
    shape = tensor.shape
    if len(shape) != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(shape)}")
    if length is not None and shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got {shape[0]}")
    if shape[0] < min_length:
        raise ValueError(f"{name} must have at least {min_length} entries, got {shape[0]}")
    if contiguous and not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_device(name: str, tensor: torch.Tensor, device: torch.device, other: str) -> None:
    """``tensor`` sits on ``device``, where ``other`` (the tensor it is used with) is."""
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device} but {other} is on {device}")


def check_id_tensor(name: str, tensor: object, length: int | None = None, min_length: int = 0) -> None:
    """A 1-D signed-integer tensor (token ids, indices, cumulative counts)."""
    check_vector(name, tensor, ID_DTYPES, length, min_length)


def check_slots(name: str, slots: torch.Tensor, num_slots: int) -> None:
    """Distinct request-state slots in ``[0, num_slots)`` (two rows naming one slot would both write it);
    ``slots`` already read back to the host."""
    if bool(((slots < 0) | (slots >= num_slots)).any()) or slots.unique().numel() != slots.numel():
        raise ValueError(f"{name} must be distinct slots in [0, {num_slots}), got {slots.tolist()}")
