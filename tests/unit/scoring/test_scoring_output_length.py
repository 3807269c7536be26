"""The per-pool output-length estimator behind the cost model's decode price."""

from __future__ import annotations

import pytest

from kvgate.scoring.output_length import OutputLengthEstimator, OutputLengthParams


def test_no_expectation_until_enough_answers() -> None:
    est = OutputLengthEstimator(OutputLengthParams(min_answers=3))
    est.observe("a", 100, 1000)
    est.observe("a", 100, 1000)
    assert est.expected("a") == 0.0
    est.observe("a", 100, 1000)
    assert est.expected("a") == pytest.approx(100.0)
    assert est.expected("b") == 0.0


def test_mean_follows_the_answers_per_pool() -> None:
    est = OutputLengthEstimator(OutputLengthParams(alpha=0.5, min_answers=1))
    est.observe("a", 100, 1000)
    est.observe("a", 300, 1000)
    est.observe("b", 10, 1000)
    assert est.expected("a") == pytest.approx(200.0)
    assert est.expected("b") == pytest.approx(10.0)
    est.observe("a", -5, 1000)  # nonsense is ignored
    assert est.expected("a") == pytest.approx(200.0)


def test_the_requests_own_limit_caps_the_expectation() -> None:
    est = OutputLengthEstimator(OutputLengthParams(min_answers=1))
    est.observe("a", 1000, 1000)
    assert est.expected("a", max_tokens=64) == 64.0
    assert est.expected("a", max_tokens=4096) == pytest.approx(1000.0)
    assert est.expected("a", max_tokens=0) == 0.0


def test_retain_forgets_pools_that_left() -> None:
    est = OutputLengthEstimator(OutputLengthParams(min_answers=1))
    est.observe("a", 10, 1000)
    est.observe("b", 20, 1000)
    est.retain({"b"})
    assert est.expected("a") == 0.0
    assert est.expected("b") == pytest.approx(20.0)


def test_output_ratio_is_the_mean_answer_over_the_mean_prompt() -> None:
    est = OutputLengthEstimator(OutputLengthParams(alpha=0.5, min_answers=2))
    est.observe("a", 1800, 3000)
    assert est.output_ratio("a") == 0.0  # not enough answers yet
    est.observe("a", 2200, 1000)
    assert est.output_ratio("a") == pytest.approx(2000 / 2000)
    est.observe("a", 100, 5000)  # a short answer to a long prompt pulls both means
    assert est.output_ratio("a") == pytest.approx(1050 / 3500)
    est.observe("a", 10, -1)  # nonsense is ignored
    assert est.output_ratio("a") == pytest.approx(1050 / 3500)
    assert est.output_ratio("b") == 0.0
    est.observe("b", 50, 0)
    est.observe("b", 50, 0)  # empty prompts: no division by zero
    assert est.output_ratio("b") == pytest.approx(50.0)
