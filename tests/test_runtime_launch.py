"""specfix.runtime.launch: the plain launch where it cannot go direct, and the key for a direct one."""

import pytest
import torch

from specfix import runtime
from specfix.runtime import launch, tl, triton

pytestmark = pytest.mark.skipif(not runtime.HAS_TRITON, reason="needs triton")


@triton.jit(do_not_specialize=["n_free"])
def _add(x_ptr, y_ptr, out_ptr, n, n_free, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask) if y_ptr is not None else 0.0
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * SCALE + y + n_free, mask=mask)


@pytest.mark.parametrize("with_y", [True, False])
@pytest.mark.parametrize("offset", [0, 1])  # a view 4 bytes past 16-byte alignment: another specialisation
def test_launch_matches_triton(with_y, offset):
    x = torch.arange(41, dtype=torch.float32, device=runtime.DEVICE)[offset : offset + 40]
    y = torch.full_like(x, 0.5) if with_y else None
    for _ in range(2):  # the second call is the cached one where the launch goes direct
        out = torch.empty_like(x)
        launch(_add, (3,), x, y, out, 40, 2, SCALE=3.0, BLOCK=16)
        expected = torch.empty_like(x)
        _add[(3,)](x, y, expected, 40, 2, SCALE=3.0, BLOCK=16)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        torch.testing.assert_close(out, x * 3.0 + (0.5 if with_y else 0.0) + 2, rtol=0, atol=0)


def test_key_tells_apart_what_triton_specialises_on():
    base = torch.zeros(8, dtype=torch.float32)
    key = lambda *args: runtime._args_key(args)[0]  # noqa: E731
    assert key(base) != key(base[1:])  # 16-byte alignment
    assert key(base) == key(base[4:])
    assert key(base) != key(base.to(torch.float16))  # dtype
    assert key(None) != key(base)
    assert len({key(1), key(2), key(16), key(True), key(1.0)}) == 5
    assert key(base, "text") is None and key(torch.nn.Parameter(base)) is None
    assert runtime._args_key((base[2:], 5, None)) == (
        ((torch.float32, False, -1), 5, None),
        [base.data_ptr() + 8, 5, None],
    )
