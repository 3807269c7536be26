"""The online prefill-rate estimator."""

from __future__ import annotations

import random

import pytest

from kvgate.scoring.prefill_rate import PrefillRateEstimator, PrefillRateParams


def test_no_estimate_until_enough_evidence() -> None:
    est = PrefillRateEstimator(PrefillRateParams(min_observed_tokens=2048))
    assert est.rate("a") is None
    est.observe("a", 1000, 0.1)
    assert est.rate("a") is None
    est.observe("a", 1500, 0.15)
    assert est.rate("a") == pytest.approx(10_000.0)


def test_converges_to_true_rate_with_noise() -> None:
    rng = random.Random(7)
    est = PrefillRateEstimator()
    true_rate = 18_000.0
    for _ in range(300):
        tokens = rng.randint(200, 8000)
        est.observe("a", tokens, tokens / true_rate * rng.uniform(0.9, 1.1))
    rate = est.rate("a")
    assert rate is not None
    assert rate == pytest.approx(true_rate, rel=0.08)


def test_tracks_a_change_in_rate() -> None:
    est = PrefillRateEstimator()
    for _ in range(50):
        est.observe("a", 4096, 4096 / 10_000)
    for _ in range(30):
        est.observe("a", 4096, 4096 / 5_000)  # pod slowed down (e.g. co-located load)
    assert est.rate("a") == pytest.approx(5_000.0, rel=0.01)


def test_large_observations_weigh_more_than_small_ones() -> None:
    big_first = PrefillRateEstimator()
    big_first.observe("a", 4096, 4096 / 10_000)
    big_first.observe("a", 100, 100 / 1_000)  # small, slow: moves the estimate a little
    small_first = PrefillRateEstimator()
    small_first.observe("a", 4096, 4096 / 10_000)
    small_first.observe("a", 32_000, 32_000 / 1_000)  # large, slow: moves it a lot
    r_small, r_big = big_first.rate("a"), small_first.rate("a")
    assert r_small is not None and r_big is not None
    assert r_small > 8_000
    assert r_big < 3_000


def test_ignores_short_and_non_positive_observations() -> None:
    est = PrefillRateEstimator(PrefillRateParams(min_observed_tokens=0))
    est.observe("a", 10, 0.5)
    est.observe("a", 5000, 0.0)
    est.observe("a", 5000, -1.0)
    assert "a" not in est
    assert est.rate("a") is None


def test_rate_is_clamped() -> None:
    params = PrefillRateParams(min_observed_tokens=0, max_tokens_per_second=50_000)
    est = PrefillRateEstimator(params)
    est.observe("a", 10_000, 1e-6)
    est.observe("b", 10_000, 1e6)
    assert est.rate("a") == 50_000
    assert est.rate("b") == params.min_tokens_per_second


def test_ttft_observation_only_when_nothing_was_queued_ahead() -> None:
    est = PrefillRateEstimator(PrefillRateParams(min_observed_tokens=0, ttft_overhead_seconds=0.01))
    est.observe_ttft("a", 5000, 0.51, queued_ahead=0)
    est.observe_ttft("b", 5000, 3.0, queued_ahead=2)
    assert est.rate("a") == pytest.approx(10_000)
    assert est.rate("b") is None


def test_pods_are_independent_and_forgettable() -> None:
    est = PrefillRateEstimator(PrefillRateParams(min_observed_tokens=0))
    est.observe("a", 4096, 0.4096)
    est.observe("b", 4096, 0.8192)
    assert est.rate("a") == pytest.approx(10_000)
    assert est.rate("b") == pytest.approx(5_000)
    est.forget("a")
    assert est.rate("a") is None
    assert est.rate("b") == pytest.approx(5_000)
