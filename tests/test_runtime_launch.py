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
def test_launch_matches_triton(with_y):
    x = torch.arange(40, dtype=torch.float32, device=runtime.DEVICE)
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
    key = runtime._arg_key
    assert key(base, True) != key(base[1:], True)  # 16-byte alignment
    assert key(base, True) != key(base.to(torch.float16), True)  # dtype
    assert key(None, True) != key(base, True)
    assert key(1, True) != key(2, True) != key(16, True)  # == 1 and % 16 == 0
    assert key(1, False) == key(2, False) == key(16, False)  # do_not_specialize
    assert key(2, False) != key(1 << 40, False) != key(1 << 63, False)  # i32, i64, u64
    assert key(True, True) != key(1, True)
    with pytest.raises(runtime._Unkeyed):
        key("text", True)
