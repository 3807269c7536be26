"""The per-pool output-length estimator behind the cost model's decode price."""

from __future__ import annotations

import pytest

from kvgate.scoring.output_length import OutputLengthEstimator, OutputLengthParams


def test_no_expectation_until_enough_answers() -> None:
    est = OutputLengthEstimator(OutputLengthParams(min_answers=3))
    est.observe("a", 100)
    est.observe("a", 100)
    assert est.expected("a") == 0.0
    est.observe("a", 100)
    assert est.expected("a") == pytest.approx(100.0)
    assert est.expected("b") == 0.0


def test_mean_follows_the_answers_per_pool() -> None:
    est = OutputLengthEstimator(OutputLengthParams(alpha=0.5, min_answers=1))
    est.observe("a", 100)
    est.observe("a", 300)
    est.observe("b", 10)
    assert est.expected("a") == pytest.approx(200.0)
    assert est.expected("b") == pytest.approx(10.0)
    est.observe("a", -5)  # nonsense is ignored
    assert est.expected("a") == pytest.approx(200.0)


def test_the_requests_own_limit_caps_the_expectation() -> None:
    est = OutputLengthEstimator(OutputLengthParams(min_answers=1))
    est.observe("a", 1000)
    assert est.expected("a", max_tokens=64) == 64.0
    assert est.expected("a", max_tokens=4096) == pytest.approx(1000.0)
    assert est.expected("a", max_tokens=0) == 0.0


def test_retain_forgets_pools_that_left() -> None:
    est = OutputLengthEstimator(OutputLengthParams(min_answers=1))
    est.observe("a", 10)
    est.observe("b", 20)
    est.retain({"b"})
    assert est.expected("a") == 0.0
    assert est.expected("b") == pytest.approx(20.0)
