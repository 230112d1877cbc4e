"""specfix.mrv2.gumbel: the Triton Gumbel-max sampler against its torch reference and vLLM's own kernel,
statistics with a stated power, the edges (NaN, tiny temperatures, tiny vocabularies), masks, errors.

On a CPU the kernel runs in Triton's interpreter (about 10 ms per program instance), so it is tied to the
torch reference bit for bit on small batches and the high-power statistics run on the reference; on the
GPU machine the same tests run the compiled kernel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfix import Fixes, runtime
from specfix.lab.masked_gumbel import BATCH_KEYS, gumbel_batch
from specfix.mrv2 import gumbel, gumbel_launch
from specfix.mrv2 import gumbel_reference as ref
from specfix.tools.stats import chi_square, chi_square_power, chi_square_samples, samples_for_power

DEVICE = runtime.DEVICE
ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "gumbel_golden.pt"
SENTINEL = -777.0
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorder():
    return _script("record_gumbel_golden")


def batch(rows, vocab, *, num_reqs=None, temps=None, dtype=torch.float32, seed=0, scale=3.0):
    """Random logits and request tables (the one builder); row i is request i % num_reqs at position
    i // num_reqs + 17."""
    return gumbel_batch(
        rows,
        vocab,
        num_reqs=num_reqs,
        temperature=1.0 if temps is None else temps,
        dtype=dtype,
        seed=seed,
        scale=scale,
        first_pos=17,
        device=DEVICE,
    )


def sample(b, apply_temperature=True, is_drafting=False, **kwargs):
    return gumbel.gumbel_sample(*(b[k] for k in BATCH_KEYS), apply_temperature, is_drafting, **kwargs)


def reference(b, apply_temperature=True, is_drafting=False, **kwargs):
    return ref.gumbel_sample_reference(*(b[k] for k in BATCH_KEYS), apply_temperature, is_drafting, **kwargs)


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
    """False alarms for a true uniform, independent hash: the chi-square mark (df + 10 sd, df = 255) about
    5e-16; each |corr| < 0.01 over ~260,000 pairs is 5.1 sd, about 3e-7. Power: not claimed (a check of the
    hash's output, not a hunt for a named alternative; the kernel is tied to this reference bit for bit)."""
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("apply_temperature", [True, False])
def test_tokens_match_reference_and_the_cache_holds_logits_before_temperature(dtype, apply_temperature):
    """vLLM 0.33's contract: the draft-logits cache receives each row's logits as they are (before
    temperature, in the cache's dtype, which is theirs); the verifier divides on load."""
    b = batch(6, 1537, num_reqs=6, temps=[1.0, 0.0, 0.5, 2.0, 0.7, 1.3], dtype=dtype)
    got_buf = torch.full((6, 2, 1537), SENTINEL, dtype=dtype, device=DEVICE)
    want_buf = torch.full((6, 2, 1537), SENTINEL, dtype=dtype)
    got = sample(b, apply_temperature, logits_cache=got_buf, logits_cache_col=1)
    want = reference(
        {k: v.cpu() for k, v in b.items()}, apply_temperature, logits_cache=want_buf, logits_cache_col=1
    )
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got_buf.cpu(), want_buf)
    assert torch.equal(got_buf[:, 1].cpu(), b["logits"].cpu()) and (got_buf[:, 0] == SENTINEL).all()


def test_the_cache_takes_its_source_and_refuses_another_dtype():
    """``logits_cache_source``: what is cached instead of the sampled logits (vLLM 0.33), in the cache's
    dtype; a cache of another dtype than what it caches is refused, naming the argument, before any write."""
    b = batch(4, 700, temps=[1.0, 0.0, 0.5, 2.0])
    source = (b["logits"] * 2).to(torch.bfloat16)
    cache = torch.full((4, 3, 700), SENTINEL, dtype=torch.bfloat16, device=DEVICE)
    col = torch.tensor(2, device=DEVICE)  # a 0-d column, as vLLM's draft-model speculator passes its step
    tokens = sample(b, logits_cache=cache, logits_cache_col=col, logits_cache_source=source)
    assert torch.equal(tokens, sample(b)) and torch.equal(cache[:, 2], source)
    assert (cache[:, :2] == SENTINEL).all()
    with pytest.raises(TypeError, match=r"logits_cache \(torch.bfloat16\) must have the dtype"):
        sample(b, logits_cache=torch.zeros(4, 1, 700, dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="use_fp64=True is not supported"):
        sample(b, use_fp64=True)


@settings(max_examples=8, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 2500),
    tiles=st.sampled_from([1, 2, 5]),
    per_program=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**31 - 1),
    greedy=st.booleans(),
)
def test_any_vocab_and_tiling_matches_reference(rows, vocab, tiles, per_program, seed, greedy):
    """Any vocabulary size, in 1, 2 or 5+ tiles (the last one partial), walked 1, 2 or 3 tiles per program
    (so some rows need the second-stage kernel and some programs end on a partial or empty tile), picks the
    reference's tokens."""
    b = batch(rows, vocab, temps=[0.0 if greedy else 0.8] * rows, seed=seed)
    block = max(16, triton_next_pow2(math.ceil(vocab / tiles)))
    got = sample(b, block_size=block, tiles_per_program=per_program)
    assert torch.equal(got.cpu(), reference({k: v.cpu() for k, v in b.items()}))


@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize("num_warps", [1, 2, 4])
def test_split_rows_pick_the_reference_token_in_one_launch_or_two(monkeypatch, captured, num_warps):
    """A row split over several programs ends the same whichever program finishes it: eagerly the last to
    arrive (the arrival counters are left at 0 for the next call), under graph capture a second kernel.
    Ties between splits, here forced by a constant row, go to the lowest token, as in one program."""
    monkeypatch.setattr(gumbel, "_capturing", lambda device: captured)
    b = batch(4, 3001, temps=[0.9, 0.0, 1.4, 0.0], seed=5)
    b["logits"][3] = 1.0  # greedy over a constant row: every split ties; token 0 must win
    want = reference({k: v.cpu() for k, v in b.items()})
    for _ in range(2):  # the second call starts from the counters the first left behind
        got = sample(b, block_size=256, num_warps=num_warps, tiles_per_program=2)
        assert torch.equal(got.cpu(), want)
    assert want[3] == 0
    assert all(int(arrivals.abs().sum()) == 0 for arrivals, _ in gumbel_launch._SPLIT_SCRATCH.values())


def triton_next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def test_strided_rows_and_per_token_columns():
    wide = batch(4, 900, num_reqs=2, temps=[0.9, 1.4])
    b = dict(wide, logits=wide["logits"][:, :700])
    assert b["logits"].stride(0) == 900
    cols = torch.tensor([0, 0, 1, 1], dtype=torch.int32, device=DEVICE)
    got_buf = torch.full((2, 2, 700), SENTINEL, device=DEVICE)
    want_buf = torch.full((2, 2, 700), SENTINEL)
    got = sample(b, logits_cache=got_buf, logits_cache_col=cols)
    want = reference({k: v.cpu() for k, v in b.items()}, logits_cache=want_buf, logits_cache_col=cols.cpu())
    assert torch.equal(got.cpu(), want) and torch.equal(got_buf.cpu(), want_buf)


# ---- vLLM 0.33's noise (noise="vllm")


def _murmur3_x86_32(words: list[torch.Tensor], seed: int = 0) -> torch.Tensor:
    """MurmurHash3_x86_32, built from the reference's block update, of a key of whole 32-bit words."""
    h = torch.full_like(words[0], seed & ref.MASK32, dtype=torch.int64)
    for k in words:
        h = ref.murmur3_mix(h, k.to(torch.int64) & ref.MASK32)
    return ref.fmix32(h ^ (4 * len(words)))


def _words(data: bytes) -> list[torch.Tensor]:
    """A key of whole 32-bit little-endian words, as _murmur3_x86_32 takes it."""
    return [torch.tensor([int.from_bytes(data[i : i + 4], "little")]) for i in range(0, len(data), 4)]


# Published MurmurHash3_x86_32 values, for keys of whole 32-bit words (the only keys vLLM hashes):
# - Guava's tests (google/guava, guava-tests/test/com/google/common/hash/Murmur3Hash32Test.java,
#   testKnownIntegerInputs, testKnownLongInputs and testKnownEncodedStringInputs; seed 0, Java ints):
#   hashInt / hashLong hash the value's 4 / 8 little-endian bytes, like a seed's or position's words.
# - The SMHasher-verified table of https://stackoverflow.com/a/31929528 ("MurmurHash3 Test Vectors"),
#   which also varies the hash's own seed.
MURMUR3_VECTORS = [
    ((0).to_bytes(4, "little", signed=True), 0, 593689054),
    ((-42).to_bytes(4, "little", signed=True), 0, -189366624),
    ((2**31 - 1).to_bytes(4, "little", signed=True), 0, -1653689534),
    ((0).to_bytes(8, "little", signed=True), 0, 1669671676),
    ((-42).to_bytes(8, "little", signed=True), 0, -846261623),
    ((42).to_bytes(8, "little", signed=True), 0, 1871679806),
    ((-(2**63)).to_bytes(8, "little", signed=True), 0, 1366273829),
    ((2**63 - 1).to_bytes(8, "little", signed=True), 0, -2106506049),
    ("hell".encode("utf-16-le"), 0, 0x5A0CB7C3),
    ("http://www.google.com/".encode("utf-16-le"), 0, 0x73564D8C),  # 44 bytes: 11 words
    (bytes([0xFF, 0xFF, 0xFF, 0xFF]), 0, 0x76293B50),
    (bytes([0x21, 0x43, 0x65, 0x87]), 0, 0xF55B516B),
    (bytes([0x21, 0x43, 0x65, 0x87]), 0x5082EDEE, 0x2362F9DE),
    (bytes([0, 0, 0, 0]), 0, 0x2362F9DE),
]


@pytest.mark.parametrize("key,seed,published", MURMUR3_VECTORS)
def test_murmur3_matches_published_values(key, seed, published):
    assert int(_murmur3_x86_32(_words(key), seed)) == published & 0xFFFFFFFF


def test_vllm_token_bits_hash_seed_position_and_token_as_four_words():
    """The per-row split (three words once per row, the token's last) is MurmurHash3 of the 16 bytes."""
    seed, pos = torch.tensor([-42, 2**62 + 5]), torch.tensor([2**40 + 9, 3])
    bits = ref.vllm_token_bits(seed, pos, 5)
    for r in range(2):
        key = b"".join(int(x[r]).to_bytes(8, "little", signed=True) for x in (seed, pos))
        for token in range(5):
            whole = key[:12] + token.to_bytes(4, "little")  # the position's high word is not hashed
            assert int(bits[r, token]) == int(_murmur3_x86_32(_words(whole)))


def test_vllm_uniform_is_the_rounded_midpoint_of_the_hash():
    bits = torch.tensor([0, 1, 0xFFFF, 0x10000, 2**31, 2**32 - 2, 2**32 - 1])
    want = ((bits.double() + 0.5) * 2.0**-32).float()
    assert torch.equal(ref.vllm_uniform(bits), want)
    assert ref.vllm_uniform(bits)[-1] == 1.0  # rounds up: the log1p's floor at 2**-24 keeps the noise finite
    assert torch.isfinite(ref.vllm_gumbel_noise(torch.tensor([0]), torch.tensor([0]), 10)).all()


def test_vllm_noise_kernel_matches_reference():
    """Same hash and uniforms; the logarithms are numpy's (interpreter) or the GPU's against torch's, so the
    noise agrees to a rounding of the logarithm."""
    seed = torch.tensor([0, 1, -1, 2**62 + 17, -(2**40)]).to(DEVICE)
    pos = torch.tensor([0, 1, 2**31 + 3, 99, 7]).to(DEVICE)
    want = ref.vllm_gumbel_noise(seed.cpu(), pos.cpu(), 3001)
    torch.testing.assert_close(gumbel.gumbel_noise(seed, pos, 3001, "vllm").cpu(), want, rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize(
    "apply_temperature,is_drafting,col", [(True, True, 1), (False, False, None), (True, False, "per token")]
)
def test_vllm_mode_tokens_and_stores_match_reference(apply_temperature, is_drafting, col):
    b = batch(8, 2500, num_reqs=4, temps=[1.0, 0.0, 0.5, 2.0], seed=5)
    b["expanded_idx_mapping"][-1] = -1
    cols = torch.tensor([0, 1] * 4, device=DEVICE) if col == "per token" else col
    got_buf, got_whole = gumbel.guarded_table((4, 2, 2500), SENTINEL, torch.float32, device=DEVICE)
    want_buf = torch.full((4, 2, 2500), SENTINEL)
    store = {} if col is None else dict(logits_cache=got_buf, logits_cache_col=cols)
    got = sample(b, apply_temperature, noise="vllm", is_drafting=is_drafting, **store)
    store = (
        {}
        if col is None
        else dict(
            logits_cache=want_buf, logits_cache_col=(cols.cpu() if isinstance(cols, torch.Tensor) else cols)
        )
    )
    want = reference(
        {k: v.cpu() for k, v in b.items()}, apply_temperature, noise="vllm", is_drafting=is_drafting, **store
    )
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got_buf.cpu(), want_buf) and (got_whole[[0, -1]] == SENTINEL).all()
    exact = reference({k: v.cpu() for k, v in b.items()}, apply_temperature)
    assert not torch.equal(want, exact)


@pytest.mark.parametrize("noise", ["exact", "vllm"])
def test_drafting_adds_the_salt_to_the_position(noise):
    b = batch(6, 900, seed=6)
    drafted = sample(b, noise=noise, is_drafting=True)
    assert torch.equal(drafted, sample(dict(b, pos=b["pos"] + ref.DRAFT_NOISE_SALT), noise=noise))
    assert not torch.equal(drafted, sample(b, noise=noise))


def test_vllm_mode_mixes_the_drafter_column_into_the_seed():
    """vLLM 0.33's spec_step_seed: a call that caches into column c draws with seed ^ (c << 32)."""
    b = batch(6, 900, seed=7)
    buf = torch.zeros(6, 3, 900, device=DEVICE)
    cached = sample(b, noise="vllm", logits_cache=buf, logits_cache_col=2)
    assert torch.equal(cached, sample(dict(b, seed=b["seed"] ^ (2 << 32)), noise="vllm"))
    assert not torch.equal(cached, sample(b, noise="vllm"))


@pytest.mark.skipif(
    DEVICE.type != "cpu",
    reason="the interpreter's comparison; on a GPU scripts/compare_vllm_noise.py makes it",
)
def test_same_tokens_and_cache_as_vllms_own_kernel_in_the_interpreter(vllm_gumbel):
    """vLLM 0.33's gumbel_sample (fetched into .peer/) and noise="vllm", both in Triton's interpreter, on
    the comparison scripts/compare_vllm_noise.py makes on the GPU: every temperature of TEMPERATURES (0 to
    10, the tiny ones included), both drafting flags, temperature applied or not, fp32/bf16/fp16, no cache,
    a 0-d column and a column per row, padded rows. Tokens and caches must be identical."""
    compare = _script("compare_vllm_noise")
    rows = sampled = cached = 0
    for i, case in enumerate(compare.cases((1100,), compare.DTYPES)):
        b = compare.make_batch(
            9, case["vocab"], compare.DTYPES[case["dtype"]], seed=i, device="cpu", rows_per_request=1
        )  # 8 requests, one per temperature, and a padded row
        live = b["temperature"][b["expanded_idx_mapping"][:-1]]
        assert torch.equal(live.sort().values, torch.tensor(compare.TEMPERATURES).sort().values)
        got = compare.compare(
            vllm_gumbel,
            b,
            apply_temperature=case["apply_temperature"],
            is_drafting=case["is_drafting"],
            cache=case["cache"],
        )
        assert got["mismatches"] == 0 and got["cache_mismatches"] == 0 and not got["stored_outside"], (
            case,
            got["first_mismatches"],
        )
        rows, sampled, cached = rows + got["rows"], sampled + got["not_argmax"], cached + bool(case["cache"])
    assert rows == 36 * 9 and cached == 24 and sampled > rows // 5  # the noise decided many tokens


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


# Every statistical test below: Pearson's chi-square (specfix.tools.stats) of n draws against
# softmax(logits / T), passed while its p_value exceeds ALPHA, so a correct sampler fails it with probability
# ALPHA (the false alarm). n is the fewest draws at which the same test would reject each named wrong
# sampler with probability >= POWER; test_sample_sizes_give_the_stated_power computes and simulates that.
ALPHA = 1e-6
POWER = 0.99


def alternatives(logits: np.ndarray, temperature: float) -> dict[str, np.ndarray]:
    """Three samplers that are slightly wrong: one whose temperature is 5% high, and two that add 0.05 to
    the logits of even (or odd) token ids (their probabilities x1.05 before renormalising)."""
    even = np.arange(len(logits)) % 2 == 0
    return {
        "temperature 5% high": softmax64(torch.from_numpy(logits), temperature * 1.05),
        "logit bias 0.05 on even ids": softmax64(torch.from_numpy(logits + 0.05 * even), temperature),
        "logit bias 0.05 on odd ids": softmax64(torch.from_numpy(logits + 0.05 * ~even), temperature),
    }


def assert_follows_softmax(tokens: np.ndarray, logits: np.ndarray, temperature: float) -> None:
    p_value = chi_square_samples(tokens, softmax64(torch.from_numpy(logits), temperature))["p_value"]
    assert p_value > ALPHA, p_value


def power_case(vocab: int, temperature: float, scale: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Logits of one row, their softmax and the number of draws the stated power needs for them."""
    logits = (torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)) * scale).double().numpy()
    p = softmax64(torch.from_numpy(logits), temperature)
    wrong = alternatives(logits, temperature).values()
    return logits, p, max(samples_for_power(p, q, ALPHA, POWER) for q in wrong)


POWER_CASES = [(10, 1.0, 1.0), (12, 0.7, 1.5)]  # vocabulary, temperature, logit scale


@pytest.mark.parametrize("vocab,temperature,scale", POWER_CASES)
def test_sample_sizes_give_the_stated_power(vocab, temperature, scale):
    """The n the tests below draw: the test at ALPHA rejects each named wrong sampler with probability >=
    POWER, computed (noncentral chi-square) and simulated (2,000 samples of n draws from each wrong
    distribution, where 20 misses are expected and 40 would be 4.5 standard deviations out)."""
    logits, p, n = power_case(vocab, temperature, scale)
    assert 10_000 < n < 1_000_000 and n * p.min() >= 5  # no bins merge: the computed power is the test's
    rng = np.random.default_rng(vocab)
    for name, q in alternatives(logits, temperature).items():
        assert chi_square_power(p, q, n, ALPHA) >= POWER, name
        missed = sum(chi_square(c, p)["p_value"] >= ALPHA for c in rng.multinomial(n, q, size=2000))
        assert missed <= 40, (name, missed)


@pytest.mark.parametrize("noise", ["exact", "vllm"])
@pytest.mark.parametrize("vocab,temperature,scale", POWER_CASES)
def test_reference_samples_follow_softmax_with_stated_power(noise, vocab, temperature, scale):
    """n draws from the torch reference (the kernel's tokens: bit for bit in the exact mode, and vLLM's in
    the vllm mode, tests above), each row its own (seed, position), the temperature applied by the sampler.
    n (about 10**5) is what the stated power needs: a temperature 5% high or a logit bias of 0.05 on even or
    odd ids would fail with probability >= POWER; the draws pass against softmax(logits / T)."""
    logits, _, n = power_case(vocab, temperature, scale)
    b = {k: v.cpu() for k, v in batch(n, 1, num_reqs=1000, temps=[temperature] * 1000, seed=vocab).items()}
    b["logits"] = torch.from_numpy(logits).float().expand(n, vocab)
    assert_follows_softmax(reference(b, noise=noise).numpy(), logits, temperature)


def test_fast_noise_follows_softmax_with_stated_power():
    """The fast mode's noise as this device draws it (in the interpreter its log2 stands in for the GPU's
    lg2.approx): n draws of a vocabulary of 10, each from its own stretch of token ids of one long noise row,
    with the power stated above."""
    ((vocab, temperature, scale),) = POWER_CASES[:1]
    logits, _, n = power_case(vocab, temperature, scale)
    g = gumbel.gumbel_noise(
        torch.tensor([77], device=DEVICE), torch.tensor([3], device=DEVICE), n * vocab, "fast"
    ).cpu()
    x = torch.from_numpy(logits).float() / temperature * ref.LOG2E  # the fast mode's scores: log2 units
    assert_follows_softmax((x + g.view(n, vocab)).argmax(-1).numpy(), logits, temperature)


# ---- the edges: NaN logits, temperatures next to zero, tiny vocabularies


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's max of an all-NaN tile
@pytest.mark.parametrize("noise", ["exact", "vllm"])
def test_a_nan_score_never_wins_and_kernel_and_reference_agree(noise):
    """The rule: the highest score that is not NaN wins (ties to the lowest id); a row whose scores are all
    NaN or -inf gives token 0. Rows: one NaN (sampled and greedy), the NaN at the row's best logit, all NaN,
    NaN and -inf only; over several tiles."""
    b = batch(7, 700, num_reqs=7, temps=[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0], seed=8)
    logits = b["logits"]
    logits[0, 59] = logits[1, 59] = float("nan")
    for r in (2, 3):
        logits[r, int(logits[r].argmax())] = float("nan")
    logits[4] = logits[5] = float("nan")
    logits[6] = float("-inf")
    logits[6, ::3] = float("nan")
    got = sample(b, noise=noise, block_size=256, tiles_per_program=2).cpu()
    want = reference({k: v.cpu() for k, v in b.items()}, noise=noise)
    assert torch.equal(got, want)
    assert got[0] != 59 and got[1] == int(torch.nan_to_num(logits[1].cpu(), nan=float("-inf")).argmax())
    assert not torch.isnan(logits[2:4].cpu()[[0, 1], got[2:4]]).any()
    assert got[4:].tolist() == [0, 0, 0]


@pytest.mark.parametrize("noise", ["exact", "fast", "vllm"])
@pytest.mark.parametrize("apply_temperature", [True, False])
def test_only_temperature_zero_is_greedy(noise, apply_temperature):
    """As vLLM 0.33's kernel: T == 0 is the plain argmax; any other T, however tiny (5e-6 and 1e-7 lie under
    vLLM's _SAMPLING_EPS; its SamplingParams would have raised them to 0.01), divides the logits (or not,
    with apply_temperature=False) and adds noise. The cache holds the logits as they are either way."""
    temps = [0.0, 1e-7, 5e-6, 1e-5] * 4
    b = batch(16, 900, temps=temps, seed=9, scale=0.1)
    buf = torch.full((16, 1, 900), SENTINEL, device=DEVICE)
    got = sample(b, apply_temperature, noise=noise, logits_cache=buf).cpu()
    argmax = b["logits"].cpu().argmax(-1)
    greedy = torch.tensor(temps) == 0
    assert torch.equal(got[greedy], argmax[greedy])
    if not apply_temperature:  # logits of scale 0.1 plus Gumbel noise: the noise decides most rows
        assert (got[~greedy] != argmax[~greedy]).sum() >= 8
    assert torch.equal(buf[:, 0].cpu(), b["logits"].cpu())
    if noise != "fast":
        assert torch.equal(reference({k: v.cpu() for k, v in b.items()}, apply_temperature, noise=noise), got)


@pytest.mark.parametrize("vocab", range(1, 9))
def test_tiny_vocabularies_work(vocab):
    b = batch(5, vocab, temps=[1.0, 0.0, 0.3, 2.0, 1.0], seed=vocab)
    for noise in ("exact", "vllm"):
        got = sample(b, noise=noise).cpu()
        assert torch.equal(got, reference({k: v.cpu() for k, v in b.items()}, noise=noise))
        assert ((got >= 0) & (got < vocab)).all()


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
        pytest.fail(
            f"{GOLDEN.relative_to(ROOT)} is not recorded yet: run scripts/record_gumbel_golden.py on a GPU"
        )
    golden = torch.load(GOLDEN, weights_only=True)
    recorder = _recorder()
    for case in recorder.golden_cases():
        got = recorder.run_case(case, device)
        want = golden["cases"][case["name"]]
        assert torch.equal(got["tokens"], want["tokens"]), case["name"]
        if got["cache"] is not None:  # a copy of the logits before temperature: no arithmetic to record
            assert torch.equal(got["cache"], recorder.expected_cache(case)), case["name"]
    nc = recorder.noise_case()
    noise = gumbel.gumbel_noise(nc["seed"].to(device), nc["pos"].to(device), nc["vocab"]).cpu()
    assert torch.equal(noise, golden["noise"])
    assert "H200" in golden["meta"]["device"]


# ---- masking: the -1 row

GUARD_TEMPERATURE, GUARD_SEED = 10.0, 12345


def padded_drafter_batch():
    """4 live rows (request slots 0..3, drafter column 1) and 2 padded rows (-1), as PR #47066 pads them."""
    b = batch(6, 777, num_reqs=4, temps=[1.0, 0.6, 0.0, 1.5], seed=9)
    b["expanded_idx_mapping"] = torch.tensor([2, 0, 3, 1, -1, -1], device=DEVICE)
    b["pos"] = torch.tensor([4, 5, 6, 7, 8, 9], device=DEVICE)
    return b


def guarded(b: dict) -> tuple[dict, torch.Tensor, dict[str, torch.Tensor]]:
    """``b`` with its temperature and seed tables, and a draft-logits cache, each inside one allocation
    with a guard row before and after it (the pre-fix kernel's row -1 is the guard in front, holding
    temperature 10 and seed 12345): ``(b, buffer, whole allocations by table)``."""
    temperature, temp_whole = gumbel.guarded_table(
        (4,), 0.0, torch.float32, guard_fill=GUARD_TEMPERATURE, device=DEVICE
    )
    temperature.copy_(b["temperature"])
    seed, seed_whole = gumbel.guarded_table((4,), 0, torch.int64, guard_fill=GUARD_SEED, device=DEVICE)
    seed.copy_(b["seed"])
    buf, buf_whole = gumbel.guarded_table((4, 2, 777), SENTINEL, torch.float32, device=DEVICE)
    wholes = {"temperature": temp_whole, "seed": seed_whole, "logits_cache": buf_whole}
    return dict(b, temperature=temperature, seed=seed), buf, wholes


def as_if_reading_the_guard(b: dict, seed: int = GUARD_SEED) -> dict:
    """``b`` as a kernel that read row -1 would see every row: the guard's temperature, and its seed (or
    ``seed``: what a kernel that masked only the seed load would use)."""
    return dict(
        b,
        expanded_idx_mapping=torch.zeros(6, dtype=torch.int64, device=DEVICE),
        temperature=torch.tensor([GUARD_TEMPERATURE], device=DEVICE),
        seed=torch.tensor([seed], device=DEVICE),
    )


def test_masked_kernel_skips_padded_rows():
    """With guard tables: the padded rows act as greedy rows (a kernel that read the guard's temperature
    would sample them, with the guard's seed or a masked 0, and that changes their tokens: checked first),
    store nothing (the guard rows of the buffer and its column 0 keep their sentinel), and the live rows
    pick, and store, what they do alone."""
    b, buf, wholes = guarded(padded_drafter_batch())
    tokens = sample(b, logits_cache=buf, logits_cache_col=1).cpu()
    greedy = b["logits"][4:].argmax(-1).cpu()
    for seed in (GUARD_SEED, 0):
        assert (sample(as_if_reading_the_guard(b, seed)).cpu()[4:] != greedy).all()
    assert torch.equal(tokens[4:], greedy)
    assert (wholes["logits_cache"][[0, -1]] == SENTINEL).all() and (buf[:, 0] == SENTINEL).all()
    live = {k: (v[:4] if k in ("logits", "expanded_idx_mapping", "pos") else v) for k, v in b.items()}
    live_buf = torch.full((4, 2, 777), SENTINEL, device=DEVICE)
    assert torch.equal(tokens[:4], sample(live, logits_cache=live_buf, logits_cache_col=1).cpu())
    assert torch.equal(buf, live_buf)


def test_unmasked_kernel_reads_and_writes_row_minus_one():
    """Pre-fix kernel, guard tables: row -1 is the guard, and the kernel uses it."""
    b, buf, wholes = guarded(padded_drafter_batch())
    b["logits"][5] = b["logits"][4]  # both padded rows write row -1: same values, whichever lands last
    unmasked = Fixes(mask_invalid_reqs=False)
    tokens = sample(b, logits_cache=buf, logits_cache_col=1, fixes=unmasked).cpu()
    # write: the last padded row's logits landed in the guard row before the table
    buf_whole = wholes["logits_cache"]
    assert torch.equal(buf_whole[0, 1].cpu(), b["logits"][5].cpu())
    assert (buf_whole[0, 0] == SENTINEL).all() and (buf_whole[-1] == SENTINEL).all()
    # read: the padded rows sampled with the guard's temperature and seed instead of greedily
    assert torch.equal(tokens[4:], sample(as_if_reading_the_guard(b)).cpu()[4:])
    # the live rows themselves are unaffected
    assert torch.equal(sample(b).cpu()[:4], tokens[:4])


@contextlib.contextmanager
def interpreter_accesses(monkeypatch):
    """``(reads, writes)``: the element addresses every load and store of Triton's interpreter touches
    (lanes whose mask is off are not touched) while the block runs."""
    from triton.runtime.interpreter import InterpreterBuilder

    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    reads, writes = [], []

    def recorded(into, ptrs, mask):
        into.append(ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)].astype(np.int64))

    def masked_load(self, ptrs, mask, *args):
        recorded(reads, ptrs, mask)
        return load(self, ptrs, mask, *args)

    def masked_store(self, ptrs, value, mask, *args):
        recorded(writes, ptrs, mask)
        return store(self, ptrs, value, mask, *args)

    with monkeypatch.context() as patch:
        patch.setattr(InterpreterBuilder, "create_masked_load", masked_load)
        patch.setattr(InterpreterBuilder, "create_masked_store", masked_store)
        yield reads, writes


def touches_a_guard(addresses: list[np.ndarray], whole: torch.Tensor) -> bool:
    """Whether any address lies in the first or the last row of ``whole``."""
    row_bytes = whole[0].numel() * whole.element_size()
    start, end = whole.data_ptr(), whole.data_ptr() + whole.numel() * whole.element_size()
    hit = np.concatenate(addresses) if addresses else np.zeros(0, np.int64)
    in_front = (hit >= start) & (hit < start + row_bytes)
    return bool((in_front | ((hit >= end - row_bytes) & (hit < end))).any())


@pytest.mark.skipif(
    not runtime.INTERPRET,
    reason="records the interpreter's memory accesses; on a GPU "
    "scripts/sanitize_gumbel.py records compute-sanitizer's view",
)
def test_masked_kernel_never_touches_row_minus_one(monkeypatch):
    """Every address the interpreted kernel loads or stores, recorded: with the fix, none lies in a guard
    row of the temperature, seed or draft-logits table, so each masked line is needed on its own, the
    seed load's too (a greedy padded row never uses the seed it reads, so only its address shows it).
    Without the fix the kernel reads both guards and writes the buffer's."""
    b, buf, wholes = guarded(padded_drafter_batch())
    with interpreter_accesses(monkeypatch) as (reads, writes):
        sample(b, logits_cache=buf, logits_cache_col=1)
    assert len(reads) and len(writes)
    assert not touches_a_guard(reads, wholes["temperature"])
    assert not touches_a_guard(reads, wholes["seed"])
    assert not touches_a_guard(writes, wholes["logits_cache"])
    with interpreter_accesses(monkeypatch) as (reads, writes):
        sample(b, logits_cache=buf, logits_cache_col=1, fixes=Fixes(mask_invalid_reqs=False))
    assert touches_a_guard(reads, wholes["temperature"]) and touches_a_guard(reads, wholes["seed"])
    assert touches_a_guard(writes, wholes["logits_cache"])


# ---- bad input


def _bad(**changes):
    b = batch(3, 100, num_reqs=2)
    b.update(changes)
    return b


@pytest.mark.parametrize(
    "changes,error,words",
    [
        (
            {"expanded_idx_mapping": torch.tensor([0, 1, 0], dtype=torch.uint8)},
            TypeError,
            "expanded_idx_mapping",
        ),
        ({"expanded_idx_mapping": torch.tensor([0.0, 1.0, -1.0])}, TypeError, "expanded_idx_mapping"),
        (
            {"expanded_idx_mapping": torch.tensor([0, 1], dtype=torch.int32)},
            ValueError,
            "expanded_idx_mapping",
        ),
        ({"seed": torch.tensor([1, 2], dtype=torch.int32)}, TypeError, "seed"),
        ({"seed": torch.tensor([1.0, 2.0])}, TypeError, "seed"),
        ({"temperature": torch.tensor([1.0, 0.5], dtype=torch.float64)}, TypeError, "temperature"),
        ({"temperature": torch.tensor([1.0, 0.5, 0.2])}, ValueError, "temperature and seed"),
        ({"pos": torch.tensor([1, 2, 3, 4])}, ValueError, "pos"),
        ({"pos": torch.tensor([1.0, 2.0, 3.0])}, TypeError, "pos"),
        ({"logits": torch.randn(3, 100, dtype=torch.float64)}, TypeError, "logits"),
        ({"logits": torch.randn(100, 3).t()}, ValueError, "logits rows must be contiguous"),
        ({"logits": torch.randn(3, 0)}, ValueError, "vocab"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(changes, error, words):
    b = _bad(**{k: v.to(DEVICE) for k, v in changes.items()})
    with pytest.raises(error, match=words):
        sample(b)


def test_a_list_for_a_tensor_is_refused_naming_the_argument():
    b = _bad()
    with pytest.raises(TypeError, match="expanded_idx_mapping must be a torch.Tensor"):
        gumbel.gumbel_sample(b["logits"], [0, 1, 0], b["temperature"], b["seed"], b["pos"], True, False)


@pytest.mark.skipif(DEVICE.type != "cpu", reason="value checks would need a host sync on the GPU")
@pytest.mark.parametrize(
    "changes,words",
    [
        ({"temperature": torch.tensor([1.0, -0.5])}, "temperature must be >= 0"),
        ({"temperature": torch.tensor([1.0, float("nan")])}, "temperature must be >= 0"),
        (
            {"expanded_idx_mapping": torch.tensor([0, 1, 2], dtype=torch.int32)},
            "beyond the 2 request-state rows",
        ),
    ],
)
def test_bad_values_are_refused_on_cpu(changes, words):
    with pytest.raises(ValueError, match=words):
        sample(_bad(**changes))


@pytest.mark.parametrize(
    "buf,col,error,words",
    [
        (lambda: torch.zeros(2, 2, 99), 0, ValueError, r"must have shape \[max_num_reqs, num_cols, >= 100\]"),
        (lambda: torch.zeros(3, 2, 100), 0, ValueError, "logits_cache has 3 request rows"),
        (
            lambda: torch.zeros(2, 2, 100, dtype=torch.int32),
            0,
            TypeError,
            "logits_cache .* must have the dtype",
        ),
        (lambda: torch.zeros(2, 2, 100), 2, ValueError, r"logits_cache_col=2 outside \[0, 2\)"),
        (lambda: torch.zeros(2, 2, 100), 1.0, TypeError, "logits_cache_col must be an int"),
        (
            lambda: torch.zeros(2, 2, 100),
            torch.tensor([0, 2, 1]),
            ValueError,
            r"logits_cache_col must lie in",
        ),
        (lambda: None, 1, ValueError, "logits_cache_col and logits_cache_source need logits_cache"),
    ],
)
def test_bad_output_buffer_is_refused(buf, col, error, words):
    b = _bad()
    buffer = buf()
    before = None if buffer is None else buffer.clone()
    with pytest.raises(error, match=words):
        sample(b, logits_cache=None if buffer is None else buffer.to(DEVICE), logits_cache_col=col)
    assert buffer is None or torch.equal(buffer, before)


def _strided(t):
    return torch.stack([t, t], -1)[..., 0]  # the values of t, not contiguous


@pytest.mark.parametrize(
    "changes,settings,valid",
    [
        ({}, {}, True),
        ({}, {"noise": "approximate"}, False),
        ({}, {"use_fp64": True}, False),
        ({"logits": [[0.0] * 100] * 3}, {}, False),
        ({"logits": torch.randn(3, 100, dtype=torch.float64)}, {}, False),
        ({"logits": torch.randn(3, 100).unsqueeze(0)}, {}, False),
        ({"logits": torch.randn(3, 0)}, {}, False),
        ({"logits": torch.randn(100, 3).t()}, {}, False),
        ({"logits": torch.randn(2, 100)}, {}, False),  # rows: 2 logits, 3 mapping and pos entries
        ({"expanded_idx_mapping": torch.tensor([0, 1, 0], dtype=torch.int16)}, {}, False),
        ({"expanded_idx_mapping": torch.tensor([0, 1])}, {}, False),
        ({"expanded_idx_mapping": _strided(torch.tensor([0, 1, 0]))}, {}, False),
        ({"pos": torch.zeros(3)}, {}, False),
        ({"pos": torch.zeros(4, dtype=torch.int64)}, {}, False),
        ({"pos": torch.arange(6)[::2]}, {}, False),
        ({"pos": torch.zeros(3, dtype=torch.int64, device="meta")}, {}, False),  # another device
        ({"temperature": torch.ones(2, dtype=torch.float64)}, {}, False),
        ({"temperature": torch.ones(1, 2)}, {}, False),
        ({"temperature": _strided(torch.ones(2))}, {}, False),
        ({"temperature": torch.tensor([1.0, 0.5, 0.2])}, {}, False),  # seed has 2 entries
        ({"seed": torch.tensor([1, 2], dtype=torch.int32)}, {}, False),
        ({"seed": torch.tensor([[1, 2]])}, {}, False),
        ({"seed": _strided(torch.tensor([1, 2]))}, {}, False),
        # valid, but not the plain call: a tensor subclass goes the long way round
        ({"pos": torch.nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)}, {}, True),
    ],
)
def test_the_quick_acceptance_agrees_with_the_full_checks(changes, settings, valid, monkeypatch):
    """``_plainly_valid`` spares the serving call the per-argument checks (host time per call, goal 1): it
    accepts a call only where the full checks do, and sends every other one, bad or merely unusual (a
    tensor subclass), through them."""
    moved = {
        k: v.to(DEVICE) if isinstance(v, torch.Tensor) and not v.is_meta else v for k, v in changes.items()
    }
    args = [_bad(**moved)[k] for k in BATCH_KEYS]
    use_fp64, noise = settings.get("use_fp64", False), settings.get("noise", "fast")
    quick = gumbel_launch._plainly_valid(*args, use_fp64, noise)
    monkeypatch.setattr(gumbel_launch, "_plainly_valid", lambda *_: False)  # the full checks alone
    with contextlib.nullcontext() if valid else pytest.raises((TypeError, ValueError)):
        gumbel_launch._validate(*args, None, None, None, use_fp64, noise, None, None)
    plain = all(type(a) is torch.Tensor for a in args)
    assert quick == (valid and plain)


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
        sample(b, logits_cache=buf, logits_cache_col=1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample(b, logits_cache=buf, logits_cache_col=1)
    for step in range(3):
        b["pos"].add_(1)
        b["logits"].normal_().mul_(3)
        buf.fill_(SENTINEL)
        graph.replay()
        want_buf = torch.full((4, 2, 777), SENTINEL)
        want = reference({k: v.cpu() for k, v in b.items()}, logits_cache=want_buf, logits_cache_col=1)
        assert torch.equal(out.cpu(), want), step
        assert torch.equal(buf.cpu(), want_buf), step


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("noise", ["exact", "fast", "vllm"])
@pytest.mark.parametrize("vocab,temperature,scale", POWER_CASES)
def test_compiled_kernel_follows_softmax_with_stated_power(noise, vocab, temperature, scale):
    """The compiled kernel's own draws (the fast mode with the hardware's lg2), with the power stated above:
    a temperature 5% high or a logit bias of 0.05 on even or odd ids would fail with probability >= POWER."""
    logits, _, n = power_case(vocab, temperature, scale)
    b = batch(n, 1, num_reqs=1000, temps=[temperature] * 1000, seed=vocab)
    b["logits"] = torch.from_numpy(logits).float().expand(n, vocab).contiguous().cuda()
    assert_follows_softmax(sample(b, noise=noise).cpu().numpy(), logits, temperature)


@pytest.mark.cuda
@cuda
def test_fast_and_exact_modes_differ_only_in_near_ties_on_the_gpu():
    """Same hash, different logarithms: a row's fast token may differ from its exact one only where the two
    winners' exact scores are closer than the two noises can move them apart (twice the largest difference
    between the noises, plus a float32 rounding of each score). Every even row gets a planted near-tie (its
    runner-up lifted to within that difference of its winner), so that some rows do differ."""
    rows, vocab = 512, 32_000
    b = batch(rows, vocab, seed=8)  # temperature 1: a score is logit + noise
    seed = b["seed"][b["expanded_idx_mapping"]]
    g_exact = gumbel.gumbel_noise(seed, b["pos"], vocab, "exact").double()
    # the fast noise is -log2(-log2(1 - u)): times ln 2 it is the Gumbel shifted by ln(ln 2)
    g_fast = gumbel.gumbel_noise(seed, b["pos"], vocab, "fast").double() * math.log(2) - math.log(math.log(2))
    noise_gap = (g_fast - g_exact).abs().max().item()
    assert noise_gap < 1e-4, noise_gap  # the same uniforms; lg2.approx errs by about 2**-22 (PTX ISA)
    even = torch.arange(0, rows, 2, device=DEVICE)
    scores = b["logits"].double() + g_exact
    winner, runner_up = scores[even].topk(2).indices.unbind(-1)
    jitter = (torch.rand(len(even), generator=torch.Generator().manual_seed(1)) * 2 - 1).to(DEVICE)
    lift = scores[even, winner] - scores[even, runner_up] + jitter * noise_gap
    b["logits"][even, runner_up] += lift.float()
    scores = b["logits"].double() + g_exact
    tie = 2 * noise_gap + 8 * 2.0**-24 * scores.abs().max().item()
    exact, fast = sample(b, noise="exact"), sample(b, noise="fast")
    differ = torch.nonzero(exact != fast).flatten()
    gaps = (scores[differ, exact[differ]] - scores[differ, fast[differ]]).abs()
    assert len(differ) > 0, "no planted near-tie changed its winner: the test saw no difference to judge"
    assert bool((gaps <= tie).all()), (differ.tolist(), gaps.tolist(), tie)


if gumbel.HAS_TRITON:
    from specfix.runtime import tl, triton

    @triton.jit
    def _tile_argmax_kernel(
        logits_ptr,
        idx_mapping_ptr,
        temperature_ptr,
        seed_ptr,
        pos_ptr,
        value_ptr,
        index_ptr,
        DEPTH: tl.constexpr,
        LANES: tl.constexpr,
        ONE_D: tl.constexpr,
    ):
        """Row r's one tile through gumbel_block_argmax, greedy (no noise): its max and index per column."""
        row = tl.program_id(0)
        if ONE_D:
            block = tl.arange(0, LANES)
        else:
            block = tl.arange(0, DEPTH)[:, None] * LANES + tl.arange(0, LANES)[None, :]
        x = tl.load(logits_ptr + row * DEPTH * LANES + block)
        value, index = gumbel.gumbel_block_argmax(
            x,
            block,
            block >= 0,
            row,
            idx_mapping_ptr,
            temperature_ptr,
            seed_ptr,
            pos_ptr,
            None,
            0,
            0,
            None,
            None,
            0,
            0,
            0,
            False,
            False,
            False,
            True,
            0,
            False,
        )
        out = tl.arange(0, LANES)
        if ONE_D:
            tl.store(value_ptr + row * LANES + out, tl.zeros([LANES], tl.float32) + value, mask=out < 1)
            tl.store(index_ptr + row * LANES + out, tl.zeros([LANES], tl.int32) + index, mask=out < 1)
        else:
            tl.store(value_ptr + row * LANES + out, value)
            tl.store(index_ptr + row * LANES + out, index)


@pytest.mark.skipif(not gumbel.HAS_TRITON, reason="needs triton")
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("one_d", [True, False], ids=["1-D tile (vLLM's)", "2-D tile (specfix's)"])
def test_the_tile_helper_returns_the_first_max_along_the_first_axis(one_d):
    """vLLM's contract: one tile in, its max and the index of its first maximum out (along the first axis of
    a 2-D tile, per column). Ties go to the lower index; a NaN never wins over a number."""
    depth, lanes = (1, 64) if one_d else (8, 16)
    gen = torch.Generator().manual_seed(3)
    tiles = torch.randint(-3, 3, (5, depth, lanes), generator=gen).float()  # many ties
    tiles[1] = 2.0  # every entry ties
    tiles[2, 0] = float("nan")  # NaN at the first index
    tiles[3] = float("nan")
    tiles[3, -1] = -1.0  # one number among NaNs
    tiles[4, :, ::2] = float("-inf")
    rows = tiles.shape[0]
    value = torch.full((rows, lanes), SENTINEL)
    index = torch.full((rows, lanes), -1, dtype=torch.int32)
    args = [
        t.to(DEVICE)
        for t in (
            tiles.reshape(rows, -1).contiguous(),
            torch.zeros(rows, dtype=torch.int32),
            torch.zeros(1),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(rows, dtype=torch.int64),
            value,
            index,
        )
    ]
    _tile_argmax_kernel[(rows,)](*args, DEPTH=depth, LANES=lanes, ONE_D=one_d)
    value, index = args[-2].cpu(), args[-1].cpu()
    flat = tiles.reshape(rows, -1) if one_d else tiles  # reduce the first axis
    numbers = torch.where(flat.isnan(), float("-inf"), flat)
    want_value = numbers.amax(dim=1 if one_d else 1)
    first = (numbers == want_value.unsqueeze(1)).int().argmax(dim=1)  # the first index at the max
    if one_d:
        value, index = value[:, 0], index[:, 0]
    keep = ~(flat.isnan().all(dim=1))  # an all-NaN column: no number
    assert torch.equal(index[keep], first[keep].int())
    assert torch.equal(value[keep], want_value[keep])


@pytest.mark.skipif(not gumbel.HAS_TRITON, reason="needs triton")
def test_the_launch_path_reads_nothing_back_unless_device_checks_is_on(monkeypatch):
    """Declared GPU tensors (the test runs anywhere), the launch path with the debug switch off hands no value
    to the host and launches once; with it on, a negative temperature and a request row past the table are
    refused by name before any launch."""
    from specfix.tools.syncs import host_reads
    from specfix.v1 import device_checks

    launches = []

    class Kernel:
        def run(self, *args, grid, warmup, **kwargs):
            launches.append(grid)

    monkeypatch.setattr(device_checks, "wanted", lambda *tensors: device_checks.on())
    monkeypatch.setattr(gumbel, "_gumbel_sample_kernel", Kernel())
    b = batch(3, 64, temps=[0.7, -1.0, 0.9])
    b["expanded_idx_mapping"][2] = 5
    with device_checks.enabled(False):
        _, reads = host_reads(lambda: sample(b))
    assert reads == [] and len(launches) == 1
    with device_checks.enabled(), pytest.raises(ValueError, match="temperature must be >= 0"):
        sample(b)
    b["temperature"][1] = 0.5
    with device_checks.enabled(), pytest.raises(ValueError, match="expanded_idx_mapping holds 5"):
        sample(b)
    assert len(launches) == 1


def test_the_launch_plan_is_chosen_once_per_shape():
    """Two calls of one shape share one plan (and its dicts of kernel switches): no launch configuration is
    recomputed per call; another shape gets its own. Float overrides are refused before they key it."""
    gumbel._plan.cache_clear()
    key = (8, 32_000, 4, ("fast", False, False, False, True), (None, None, None))
    for _ in range(3):
        gumbel._plan(*key)
    assert gumbel._plan.cache_info().misses == 1 and gumbel._plan.cache_info().hits == 2
    assert gumbel._plan(9, *key[1:]) is not gumbel._plan(*key)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        sample(_bad(), block_size=16.0)
    with pytest.raises(ValueError, match="tiles_per_program must be a positive int"):
        sample(_bad(), tiles_per_program=2.0)
