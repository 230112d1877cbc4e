"""The chi-square goodness-of-fit test every chapter uses to say "these samples follow that distribution".

A correct sampler essentially never fails it, while a biased one (a stale draft distribution, a placeholder
accepted as a token) fails it by orders of magnitude. Read :func:`chi_square` first.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats


def chi_square(counts, probs) -> dict:
    """Test observed ``counts`` per token against ``probs``; returns chi2, df, threshold, passed, p_value."""
    counts, probs = np.asarray(counts, dtype=float), np.asarray(probs, dtype=float)
    if counts.shape != probs.shape or counts.ndim != 1:
        raise ValueError(f"counts and probs must be 1-D of one length, got {counts.shape} and {probs.shape}")
    if counts.sum() <= 0:
        raise ValueError("counts is empty: nothing to test")
    expected = probs / probs.sum() * counts.sum()
    # merge bins, most likely tokens first, until each expects at least 5 samples
    obs_bins, exp_bins, o_acc, e_acc = [], [], 0.0, 0.0
    for i in np.argsort(-expected, kind="stable"):
        o_acc, e_acc = o_acc + counts[i], e_acc + expected[i]
        if e_acc >= 5:
            obs_bins.append(o_acc)
            exp_bins.append(e_acc)
            o_acc = e_acc = 0.0
    if not exp_bins:  # too few samples for even one full bin
        obs_bins, exp_bins = [o_acc], [e_acc]
    else:  # a leftover tail joins the last bin
        obs_bins[-1] += o_acc
        exp_bins[-1] += e_acc
    obs, exp = np.array(obs_bins), np.array(exp_bins)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    df = len(exp) - 1
    threshold = df + 10 * math.sqrt(2 * df)  # ten standard deviations above the chi-square's mean
    return {
        "chi2": chi2,
        "df": df,
        "threshold": threshold,
        "passed": bool(chi2 <= threshold),
        "p_value": float(stats.chi2.sf(chi2, df)) if df else 1.0,
    }


def chi_square_samples(samples, probs) -> dict:
    """:func:`chi_square` of integer token samples."""
    return chi_square(np.bincount(np.asarray(samples), minlength=len(probs)), probs)


def chi_square_power(probs, wrong, n: int, alpha: float) -> float:
    """The probability that n draws from ``wrong`` give a p_value below ``alpha`` against ``probs``; exact
    only while no bins merge (every n * probs >= 5)."""
    p, q = np.asarray(probs, dtype=float), np.asarray(wrong, dtype=float)
    df = len(p) - 1
    # under wrong the statistic is about noncentral chi-square, noncentrality n * sum((q - p)**2 / p)
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, n * float(((q - p) ** 2 / p).sum())))


def samples_for_power(probs, wrong, alpha: float, power: float) -> int:
    """The fewest draws at which :func:`chi_square_power` reaches ``power``."""
    draws = optimize.brentq(lambda n: chi_square_power(probs, wrong, n, alpha) - power, 1e-9, 1e9, xtol=1e-9)
    return math.ceil(draws)
