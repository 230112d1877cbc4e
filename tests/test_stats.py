"""The suite's chi-square test, checked on cases worked out by hand and by its power."""

import numpy as np
import pytest

from specfix.tools.stats import chi_square, chi_square_power, chi_square_samples, samples_for_power


def test_perfect_fit_scores_zero():
    r = chi_square([30, 70], [0.3, 0.7])
    assert r["chi2"] == 0 and r["df"] == 1 and r["passed"]


def test_hand_worked_statistic_and_threshold():
    # expected 50, 50; (60-50)^2/50 + (40-50)^2/50 = 4; df 1, threshold 1 + 10 * sqrt(2)
    r = chi_square([60, 40], [0.5, 0.5])
    assert r["chi2"] == pytest.approx(4.0) and r["threshold"] == pytest.approx(1 + 10 * 2**0.5)


def test_unequal_expectations_by_hand():
    r = chi_square([50, 50], [0.3, 0.7])  # expected 30, 70
    assert r["chi2"] == pytest.approx(20**2 / 30 + 20**2 / 70)


def test_small_bins_are_merged_into_bins_of_at_least_five():
    # expected 90, 4, 3, 3: the three small bins merge into one of 10 -> df 1
    r = chi_square([90, 4, 3, 3], [0.9, 0.04, 0.03, 0.03])
    assert r["df"] == 1 and r["chi2"] == pytest.approx(0.0)


def test_zero_probability_tokens_do_not_break_it():
    assert chi_square([30, 70, 0], [0.3, 0.7, 0.0])["passed"]


def test_it_has_power_and_does_not_cry_wolf():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.25, 0.125, 0.125])
    assert chi_square_samples(rng.choice(4, 4000, p=p), p)["passed"]
    assert not chi_square_samples(rng.choice(4, 4000, p=[0.25] * 4), p)["passed"]


def test_power_and_false_alarm_match_simulation():
    """At alpha 0.05 (so both rates can be simulated): draws from p fail about 5% of the time, draws from q
    as often as the noncentral chi-square says (noncentrality 200 * 0.04 = 8: power 0.807, about
    P(|Z + sqrt(8)| > 1.96) for a standard normal Z)."""
    rng = np.random.default_rng(1)
    p, q, n = np.array([0.5, 0.5]), np.array([0.6, 0.4]), 200
    assert chi_square_power(p, q, n, 0.05) == pytest.approx(0.807, abs=1e-3)
    for probs, want in ((p, 0.05), (q, chi_square_power(p, q, n, 0.05))):
        rate = np.mean([chi_square(c, p)["p_value"] < 0.05 for c in rng.multinomial(n, probs, size=4000)])
        assert rate == pytest.approx(want, abs=0.03), (probs, rate)


def test_samples_for_power_is_the_fewest_draws_that_reach_it():
    p, q = np.array([0.5, 0.25, 0.25]), np.array([0.45, 0.3, 0.25])
    n = samples_for_power(p, q, 1e-6, 0.99)
    assert chi_square_power(p, q, n, 1e-6) >= 0.99 > chi_square_power(p, q, n - 1, 1e-6)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one length"):
        chi_square([1, 2], [1.0])
    with pytest.raises(ValueError, match="empty"):
        chi_square([0, 0], [0.5, 0.5])
