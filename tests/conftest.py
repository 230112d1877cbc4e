"""Package tests draw figures off-screen; notebooks keep their inline backend."""

import os

import matplotlib
import pytest

matplotlib.use("Agg")

import specfix  # noqa: E402,F401  (switches on Triton's interpreter before any test imports triton)


def _vllm_peer(kind: str):
    """vLLM 0.33's own ``kind`` module from ``.peer/`` (``scripts/fetch_vllm_peer.py``). Without it the test
    is skipped, or fails where ``SPECFIX_REQUIRE_PEER=1`` (CI fetches the peer: a skip there is a failure)."""
    from specfix.lab.masked_gumbel import load_vllm_sampler

    module = load_vllm_sampler("0.33.0", kind=kind)
    if module is None:
        why = f"needs vLLM 0.33's {kind} sampler in .peer/: run python scripts/fetch_vllm_peer.py 0.33.0"
        (pytest.fail if os.environ.get("SPECFIX_REQUIRE_PEER") == "1" else pytest.skip)(why)
    return module


@pytest.fixture
def vllm_gumbel():
    """``vllm/v1/worker/gpu/sample/gumbel.py`` of vLLM 0.33 (see ``_vllm_peer``)."""
    return _vllm_peer("gumbel")


@pytest.fixture
def vllm_rejection():
    """``vllm/v1/sample/rejection_sampler.py`` of vLLM 0.33 (see ``_vllm_peer``)."""
    return _vllm_peer("rejection")
