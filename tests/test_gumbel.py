"""specfix.mrv2.gumbel: the Triton Gumbel-max sampler against its torch reference, statistics, masks, errors.

On a CPU the kernel runs in Triton's interpreter (about 10 ms per program instance, so kernel-level
statistics use a few hundred rows and the high-power statistics run on the bitwise-equal torch reference);
on the GPU machine the same tests run the compiled kernel.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfix import Fixes, runtime
from specfix.mrv2 import gumbel
from specfix.mrv2 import gumbel_reference as ref
from specfix.tools.stats import chi_square_samples

DEVICE = runtime.DEVICE
ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "gumbel_golden.pt"
SENTINEL = -777.0
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _recorder():
    path = ROOT / "scripts" / "record_gumbel_golden.py"
    spec = importlib.util.spec_from_file_location("record_gumbel_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batch(rows, vocab, *, num_reqs=None, temps=None, dtype=torch.float32, seed=0, scale=3.0):
    """Random logits and request tables; row i belongs to request i % num_reqs at position i // num_reqs."""
    num_reqs = num_reqs or rows
    gen = torch.Generator().manual_seed(seed)
    temps = torch.tensor(temps if temps is not None else [1.0] * num_reqs, dtype=torch.float32)
    return dict(
        logits=(torch.randn(rows, vocab, generator=gen) * scale).to(dtype).to(DEVICE),
        expanded_idx_mapping=(torch.arange(rows, dtype=torch.int32) % num_reqs).to(DEVICE),
        temperature=temps.to(DEVICE),
        seed=torch.randint(-2**62, 2**62, (num_reqs,), generator=gen).to(DEVICE),
        pos=(torch.arange(rows) // num_reqs + 17).to(DEVICE),
    )


def sample(b, apply_temperature=True, **kwargs):
    return gumbel.gumbel_sample(b["logits"], b["expanded_idx_mapping"], b["temperature"], b["seed"], b["pos"],
                                apply_temperature, **kwargs)


def reference(b, apply_temperature=True, **kwargs):
    return ref.gumbel_sample_reference(b["logits"], b["expanded_idx_mapping"], b["temperature"], b["seed"],
                                       b["pos"], apply_temperature, **kwargs)


def chi_square_ok(samples: np.ndarray, probs: np.ndarray) -> tuple[bool, float, float]:
    r = chi_square_samples(samples, probs)
    return r["passed"], r["chi2"], r["threshold"]


def softmax64(logits_row: torch.Tensor, temperature: float) -> np.ndarray:
    x = logits_row.double().cpu().numpy() / temperature
    p = np.exp(x - x.max())
    return p / p.sum()


# ---- the noise and the kernel against the reference, bit for bit

def test_noise_kernel_matches_reference_bitwise():
    seed = torch.tensor([0, 1, -1, 2**62 + 17, -(2**40)]).to(DEVICE)
    pos = torch.tensor([0, 1, 2**31 + 3, 99, 7]).to(DEVICE)
    want = ref.gumbel_noise(seed.cpu(), pos.cpu(), 3001)
    assert torch.equal(gumbel.gumbel_noise(seed, pos, 3001).cpu(), want)


def test_uniforms_are_uniform_and_tokens_uncorrelated():
    key = ref.row_key(torch.arange(64), torch.arange(64) * 3)
    u = ref.bits_to_uniform(ref.token_bits(key, 4096)).double().numpy()
    counts = np.histogram(u, bins=256, range=(0, 1))[0]
    ok, stat, thr = chi_square_ok(np.repeat(np.arange(256), counts), np.full(256, 1 / 256))
    assert ok, (stat, thr)
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.01  # neighbouring token ids
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.01  # neighbouring rows


def test_careful_log_is_accurate_where_the_winner_lives():
    """log1p(-u) keeps full relative precision as u -> 0, where the large (winning) noise comes from."""
    u = torch.tensor([2.0**-33, 1e-9, 3e-8, 1e-6, 1e-3, 0.1, 0.5, 0.9, 1 - 2.0**-24], dtype=torch.float32)
    exact = np.log1p(-u.double().numpy())
    got = ref.log1p_neg(u).double().numpy()
    assert np.all(np.abs(got - exact) <= 4e-7 * np.abs(exact))
    naive = torch.log(1 - u).double().numpy()
    assert naive[0] == 0.0  # the naive form loses u = 2**-33 entirely: the noise would be +inf
    x = torch.logspace(-30, 30, 2001, dtype=torch.float32)
    assert np.allclose(ref.careful_log(x).double().numpy(), np.log(x.double().numpy()), rtol=3e-7, atol=1e-7)


@pytest.mark.parametrize("dtype,buf_dtype", [(torch.float32, torch.float32), (torch.float16, torch.bfloat16),
                                             (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("apply_temperature", [True, False])
def test_tokens_and_processed_logits_match_reference(dtype, buf_dtype, apply_temperature):
    b = batch(6, 1537, num_reqs=6, temps=[1.0, 0.0, 0.5, 2.0, 0.7, 1.3], dtype=dtype)
    got_buf = torch.full((6, 2, 1537), SENTINEL, dtype=buf_dtype, device=DEVICE)
    want_buf = torch.full((6, 2, 1537), SENTINEL, dtype=buf_dtype)
    got = sample(b, apply_temperature, processed_logits=got_buf, processed_logits_col=1)
    want = reference({k: v.cpu() for k, v in b.items()}, apply_temperature, processed_logits=want_buf,
                     processed_logits_col=1)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got_buf.cpu(), want_buf)


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(1, 2500), tiles=st.sampled_from([1, 2, 5]),
       per_program=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**31 - 1), greedy=st.booleans())
def test_any_vocab_and_tiling_matches_reference(rows, vocab, tiles, per_program, seed, greedy):
    """Any vocabulary size, in 1, 2 or 5+ tiles (the last one partial), walked 1, 2 or 3 tiles per program
    (so some rows need the second-stage kernel and some programs end on a partial or empty tile), picks the
    reference's tokens."""
    b = batch(rows, vocab, temps=[0.0 if greedy else 0.8] * rows, seed=seed)
    block = max(16, triton_next_pow2(math.ceil(vocab / tiles)))
    got = sample(b, block_size=block, tiles_per_program=per_program)
    assert torch.equal(got.cpu(), reference({k: v.cpu() for k, v in b.items()}))


def triton_next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def test_strided_rows_and_per_token_columns():
    wide = batch(4, 900, num_reqs=2, temps=[0.9, 1.4])
    b = dict(wide, logits=wide["logits"][:, :700])
    assert b["logits"].stride(0) == 900
    cols = torch.tensor([0, 0, 1, 1], dtype=torch.int32, device=DEVICE)
    got_buf = torch.full((2, 2, 700), SENTINEL, device=DEVICE)
    want_buf = torch.full((2, 2, 700), SENTINEL)
    got = sample(b, processed_logits=got_buf, processed_logits_col=cols)
    want = reference({k: v.cpu() for k, v in b.items()}, processed_logits=want_buf,
                     processed_logits_col=cols.cpu())
    assert torch.equal(got.cpu(), want) and torch.equal(got_buf.cpu(), want_buf)


# ---- statistics

def test_temperature_zero_is_argmax_with_ties_to_the_lowest_id():
    b = batch(3, 1000, temps=[0.0, 0.0, 0.0])
    b["logits"][1, 300] = b["logits"][1, 700] = 100.0  # a tie across tiles (block 256): lowest id wins
    b["logits"][2] = 0.0  # all equal: token 0
    got = sample(b, block_size=256).cpu()
    assert got.tolist() == [int(b["logits"][0].argmax()), 300, 0]


def test_same_seed_and_position_give_the_same_token_whatever_the_batch():
    alone = batch(4, 3000, temps=[1.0, 0.5, 2.0, 1.0], seed=3)
    first = sample(alone).cpu()
    # the same four requests at new request-state slots, shuffled among strangers, with a different tile size
    perm = [5, 2, 7, 0]
    crowd = batch(8, 3000, temps=[1.0] * 8, seed=4)
    for new_row, (slot, old_row) in enumerate(zip(perm, range(4), strict=True)):
        crowd["logits"][new_row * 2] = alone["logits"][old_row]
        crowd["expanded_idx_mapping"][new_row * 2] = slot
        crowd["temperature"][slot] = alone["temperature"][old_row]
        crowd["seed"][slot] = alone["seed"][old_row]
        crowd["pos"][new_row * 2] = alone["pos"][old_row]
    assert torch.equal(sample(crowd, block_size=1024).cpu()[::2], first)
    crowd["pos"][::2] += 1
    assert not torch.equal(sample(crowd).cpu()[::2], first)  # a new position draws new noise


@pytest.mark.parametrize("vocab,temperature,block,n,dtype", [
    (12, 1.0, None, 320, torch.float32),
    (40, 0.5, 32, 200, torch.float32),   # two tiles and the stage-2 reduction
    (30, 2.0, None, 240, torch.bfloat16),
])
def test_kernel_samples_follow_softmax(vocab, temperature, block, n, dtype):
    """One kernel call, n rows: 8 requests (8 seeds) at n / 8 positions, all with the same logits."""
    logits = (torch.randn(1, vocab, generator=torch.Generator().manual_seed(vocab)) * 2).to(dtype)
    b = batch(n, vocab, num_reqs=8, temps=[temperature] * 8, seed=vocab)
    b["logits"] = logits.expand(n, vocab).contiguous().to(DEVICE)
    tokens = sample(b, block_size=block).cpu().numpy()
    ok, stat, thr = chi_square_ok(tokens, softmax64(logits[0].float(), temperature))
    assert ok, (stat, thr)


def test_chi_square_detects_a_wrong_temperature():
    """The statistical test has teeth: samples at T=1 fail against softmax(logits / 2)."""
    logits = torch.randn(1, 30, generator=torch.Generator().manual_seed(1)) * 2
    b = {k: v.cpu() for k, v in batch(2000, 30, num_reqs=8, seed=2).items()}
    b["logits"] = logits.expand(2000, 30)
    tokens = reference(b).numpy()
    assert chi_square_ok(tokens, softmax64(logits[0], 1.0))[0]
    assert not chi_square_ok(tokens, softmax64(logits[0], 2.0))[0]


@pytest.mark.parametrize("vocab,temperature,n", [(50, 1.0, 100_000), (1000, 0.7, 10_000), (200, 3.0, 40_000)])
def test_reference_samples_follow_softmax_at_high_power(vocab, temperature, n):
    """Many draws from the reference, which picks the kernel's tokens bit for bit (tests above)."""
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    b = batch(n, vocab, num_reqs=1000, temps=[temperature] * 1000, seed=vocab)
    b = {k: v.cpu() for k, v in b.items()}
    b["logits"] = logits.expand(n, vocab)
    ok, stat, thr = chi_square_ok(reference(b).numpy(), softmax64(logits[0], temperature))
    assert ok, (stat, thr)


def test_fast_noise_follows_softmax_and_keeps_greedy_exact():
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(5)) * 2
    b = batch(240, 20, num_reqs=8, temps=[1.0] * 7 + [0.0], seed=6)
    b["logits"] = logits.expand(240, 20).contiguous().to(DEVICE)
    tokens = sample(b, noise="fast").cpu().numpy()
    greedy = b["expanded_idx_mapping"].cpu().numpy() == 7
    assert (tokens[greedy] == int(logits.argmax())).all()
    assert chi_square_ok(tokens[~greedy], softmax64(logits[0], 1.0))[0]


# ---- CPU equals GPU: golden outputs recorded on the H200

def test_golden_outputs_recorded_on_the_gpu_are_reproduced_bitwise():
    """Here, on this machine's device (Triton's interpreter on a CPU)."""
    _check_golden(DEVICE)


@pytest.mark.cuda
@cuda
def test_golden_outputs_are_reproduced_by_the_compiled_kernel():
    """The current compiled kernel still makes the recorded bits (run by `make unit`'s GPU pass)."""
    _check_golden(torch.device("cuda"))


def _check_golden(device):
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN.relative_to(ROOT)} is not recorded yet: "
                    "run scripts/record_gumbel_golden.py on a GPU")
    golden = torch.load(GOLDEN, weights_only=True)
    recorder = _recorder()
    for case in recorder.golden_cases():
        got = recorder.run_case(case, device)
        want = golden["cases"][case["name"]]
        assert torch.equal(got["tokens"], want["tokens"]), case["name"]
        if want["processed"] is not None:
            assert torch.equal(got["processed"], want["processed"]), case["name"]
    nc = recorder.noise_case()
    noise = gumbel.gumbel_noise(nc["seed"].to(device), nc["pos"].to(device), nc["vocab"]).cpu()
    assert torch.equal(noise, golden["noise"])
    assert "H200" in golden["meta"]["device"]


# ---- masking: the -1 row

def padded_drafter_batch():
    """4 live rows (request slots 0..3, drafter column 1) and 2 padded rows (-1), as PR #47066 pads them."""
    b = batch(6, 777, num_reqs=4, temps=[1.0, 0.6, 0.0, 1.5], seed=9)
    b["expanded_idx_mapping"] = torch.tensor([2, 0, 3, 1, -1, -1], dtype=torch.int32, device=DEVICE)
    b["pos"] = torch.tensor([4, 5, 6, 7, 8, 9], device=DEVICE)
    return b


def test_masked_kernel_skips_padded_rows():
    b = padded_drafter_batch()
    buf = torch.full((4, 2, 777), SENTINEL, device=DEVICE)
    tokens = sample(b, processed_logits=buf, processed_logits_col=1).cpu()
    live = {k: (v[:4] if k in ("logits", "expanded_idx_mapping", "pos") else v) for k, v in b.items()}
    live_buf = torch.full((4, 2, 777), SENTINEL, device=DEVICE)
    assert torch.equal(tokens[:4], sample(live, processed_logits=live_buf, processed_logits_col=1).cpu())
    assert torch.equal(buf, live_buf)  # the padded rows stored nothing anywhere
    assert (buf[:, 0] == SENTINEL).all()  # column 0 untouched
    # padded rows act as greedy rows: temperature reads as 0
    assert tokens[4:].tolist() == b["logits"][4:].argmax(-1).cpu().tolist()


def test_unmasked_kernel_reads_and_writes_row_minus_one():
    """Pre-fix kernel, tables with a guard row each side: row -1 is the guard, and the kernel uses it."""
    b = padded_drafter_batch()
    b["logits"][5] = b["logits"][4]  # both padded rows write row -1: same values, whichever lands last
    temperature, temp_whole = gumbel.guarded_table((4,), 0.0, torch.float32, guard_fill=2.0, device=DEVICE)
    temperature.copy_(b["temperature"])
    seed, seed_whole = gumbel.guarded_table((4,), 0, torch.int64, guard_fill=12345, device=DEVICE)
    seed.copy_(b["seed"])
    buf, buf_whole = gumbel.guarded_table((4, 2, 777), SENTINEL, torch.float32, device=DEVICE)
    b.update(temperature=temperature, seed=seed)
    unmasked = Fixes(mask_invalid_reqs=False)
    tokens = sample(b, processed_logits=buf, processed_logits_col=1, fixes=unmasked).cpu()
    # write: the last padded row's logits / guard temperature landed in the guard row before the table
    assert torch.equal(buf_whole[0, 1].cpu(), b["logits"][5].cpu() / 2.0)
    assert (buf_whole[0, 0] == SENTINEL).all() and (buf_whole[-1] == SENTINEL).all()
    # read: the padded rows sampled with the guard's temperature 2.0 and seed 12345 instead of greedily
    as_if_live = dict(b, expanded_idx_mapping=torch.zeros(6, dtype=torch.int32, device=DEVICE),
                      temperature=temp_whole[:1].clone(), seed=seed_whole[:1].clone())
    assert torch.equal(tokens[4:], sample(as_if_live).cpu()[4:])
    # the live rows themselves are unaffected, and the fixed kernel leaves the guard alone
    buf_whole[0] = SENTINEL
    fixed = sample(b, processed_logits=buf, processed_logits_col=1).cpu()
    assert torch.equal(fixed[:4], tokens[:4]) and (buf_whole[0] == SENTINEL).all()


# ---- bad input

def _bad(**changes):
    b = batch(3, 100, num_reqs=2)
    b.update(changes)
    return b


@pytest.mark.parametrize("changes,error,words", [
    ({"expanded_idx_mapping": torch.tensor([0, 1, 0], dtype=torch.uint8)}, TypeError, "expanded_idx_mapping"),
    ({"expanded_idx_mapping": torch.tensor([0.0, 1.0, -1.0])}, TypeError, "expanded_idx_mapping"),
    ({"expanded_idx_mapping": torch.tensor([0, 1], dtype=torch.int32)}, ValueError, "expanded_idx_mapping"),
    ({"seed": torch.tensor([1, 2], dtype=torch.int32)}, TypeError, "seed"),
    ({"seed": torch.tensor([1.0, 2.0])}, TypeError, "seed"),
    ({"temperature": torch.tensor([1.0, 0.5], dtype=torch.float64)}, TypeError, "temperature"),
    ({"temperature": torch.tensor([1.0, 0.5, 0.2])}, ValueError, "temperature and seed"),
    ({"pos": torch.tensor([1, 2, 3, 4])}, ValueError, "pos"),
    ({"pos": torch.tensor([1.0, 2.0, 3.0])}, TypeError, "pos"),
    ({"logits": torch.randn(3, 100, dtype=torch.float64)}, TypeError, "logits"),
    ({"logits": torch.randn(100, 3).t()}, ValueError, "logits rows must be contiguous"),
    ({"logits": torch.randn(3, 0)}, ValueError, "vocab"),
])
def test_bad_input_is_refused_naming_the_argument(changes, error, words):
    b = _bad(**{k: v.to(DEVICE) for k, v in changes.items()})
    with pytest.raises(error, match=words):
        sample(b)


def test_a_list_for_a_tensor_is_refused_naming_the_argument():
    b = _bad()
    with pytest.raises(TypeError, match="expanded_idx_mapping must be a torch.Tensor"):
        gumbel.gumbel_sample(b["logits"], [0, 1, 0], b["temperature"], b["seed"], b["pos"], True)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="value checks would need a host sync on the GPU")
@pytest.mark.parametrize("changes,words", [
    ({"temperature": torch.tensor([1.0, -0.5])}, "temperature must be >= 0"),
    ({"temperature": torch.tensor([1.0, float("nan")])}, "temperature must be >= 0"),
    ({"expanded_idx_mapping": torch.tensor([0, 1, 2], dtype=torch.int32)}, "beyond the 2 request-state rows"),
])
def test_bad_values_are_refused_on_cpu(changes, words):
    with pytest.raises(ValueError, match=words):
        sample(_bad(**changes))


@pytest.mark.parametrize("buf,col,error,words", [
    (lambda: torch.zeros(2, 2, 99), 0, ValueError, r"must have shape \[max_num_reqs, num_cols, 100\]"),
    (lambda: torch.zeros(3, 2, 100), 0, ValueError, "processed_logits has 3 request rows"),
    (lambda: torch.zeros(2, 2, 100, dtype=torch.int32), 0, TypeError, "processed_logits must be float32"),
    (lambda: torch.zeros(2, 2, 100), 2, ValueError, r"processed_logits_col=2 outside \[0, 2\)"),
    (lambda: torch.zeros(2, 2, 100), 1.0, TypeError, "processed_logits_col must be an int"),
    (lambda: None, 1, ValueError, "processed_logits_col given without processed_logits"),
])
def test_bad_output_buffer_is_refused(buf, col, error, words):
    b = _bad()
    buffer = buf()
    before = None if buffer is None else buffer.clone()
    with pytest.raises(error, match=words):
        sample(b, processed_logits=None if buffer is None else buffer.to(DEVICE), processed_logits_col=col)
    assert buffer is None or torch.equal(buffer, before)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="noise must be one of"):
        sample(_bad(), noise="approximate")
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        sample(_bad(), block_size=100)


# ---- the GPU machine only

@pytest.mark.cuda
@cuda
def test_tensors_on_two_devices_are_refused():
    with pytest.raises(ValueError, match="seed is on cpu but logits is on cuda"):
        sample(_bad(seed=torch.tensor([1, 2])))


@pytest.mark.cuda
@cuda
def test_capturable_in_a_cuda_graph():
    """The drafter's use: gumbel_sample storing draft logits, captured once, replayed on new inputs."""
    b = padded_drafter_batch()
    buf = torch.full((4, 2, 777), SENTINEL, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(b, processed_logits=buf, processed_logits_col=1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample(b, processed_logits=buf, processed_logits_col=1)
    for step in range(3):
        b["pos"].add_(1)
        b["logits"].normal_().mul_(3)
        buf.fill_(SENTINEL)
        graph.replay()
        want_buf = torch.full((4, 2, 777), SENTINEL)
        want = reference({k: v.cpu() for k, v in b.items()}, processed_logits=want_buf,
                         processed_logits_col=1)
        assert torch.equal(out.cpu(), want), step
        assert torch.equal(buf.cpu(), want_buf), step


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("noise", ["exact", "fast"])
def test_compiled_kernel_follows_softmax_at_high_power(noise):
    n, vocab = 200_000, 500
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(3)) * 3
    b = batch(n, vocab, num_reqs=1000, temps=[0.8] * 1000, seed=4)
    b["logits"] = logits.expand(n, vocab).contiguous().cuda()
    ok, stat, thr = chi_square_ok(sample(b, noise=noise).cpu().numpy(), softmax64(logits[0], 0.8))
    assert ok, (stat, thr)


@pytest.mark.cuda
@cuda
def test_fast_and_exact_modes_mostly_agree_on_the_gpu():
    """Same hash, different logarithms: tokens differ only in near-ties."""
    b = batch(512, 32_000, seed=8)
    agree = (sample(b, noise="exact") == sample(b, noise="fast")).float().mean().item()
    assert agree > 0.99, agree
