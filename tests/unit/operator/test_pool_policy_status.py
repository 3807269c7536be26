"""Condition rules: what `kubectl get` and `kubectl wait --for=condition=Ready` will show."""

from __future__ import annotations

from typing import Any

from kvgate.operator.status import Problem, Rollout, pool_status

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(generation: int = 1, observed: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {"observedGeneration": observed, **status},
    }


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def status_of(
    rollout: Rollout, previous: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    return pool_status(
        rollout=rollout,
        problem=kw.get("problem"),
        generation=4,
        selector="s",
        served_model_name="m",
        previous=previous or {},
        now=kw.get("now", T0),
    )


def test_no_deployment_yet() -> None:
    conds = by_type(status_of(Rollout.from_deployment(None, 2)))
    assert conds["Ready"]["status"] == "False"
    assert conds["Progressing"]["reason"] == "RollingOut"
    assert all(c["observedGeneration"] == 4 for c in conds.values())


def test_rollout_reads_the_deployment_status() -> None:
    rollout = Rollout.from_deployment(
        deployment(replicas=3, readyReplicas=2, updatedReplicas=3), desired=3
    )
    assert (rollout.replicas, rollout.ready, rollout.updated, rollout.up_to_date) == (3, 2, 3, True)
    assert rollout.progressing
    stale = Rollout.from_deployment(deployment(generation=2, observed=1, readyReplicas=3), 3)
    assert not stale.up_to_date and stale.progressing


def test_scaled_to_zero_is_not_ready_but_not_degraded() -> None:
    conds = by_type(status_of(Rollout.from_deployment(deployment(), desired=0)))
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert conds["Degraded"]["status"] == "False"
    assert conds["Progressing"]["status"] == "False"


def test_deployment_failures_are_degraded() -> None:
    failed = deployment(
        readyReplicas=1,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": 'ReplicaSet "x" has timed out progressing.',
            },
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "q"},
        ],
    )
    deadline_only = deployment(conditions=failed["status"]["conditions"][:1])
    conds = by_type(status_of(Rollout.from_deployment(deadline_only, desired=2)))
    assert conds["Degraded"]["reason"] == "ProgressDeadlineExceeded"
    conds = by_type(status_of(Rollout.from_deployment(failed, desired=2)))
    assert conds["Degraded"]["status"] == "True"
    assert conds["Degraded"]["reason"] == "FailedCreate"  # the cause, not the symptom
    assert conds["Ready"]["status"] == "True"  # one engine still serves


def test_problems_win_over_readiness_only_when_not_ready() -> None:
    problem = Problem("ApplyFailed", "cannot apply Service llama: quota exceeded")
    ready = Rollout.from_deployment(deployment(readyReplicas=2, updatedReplicas=2), desired=2)
    conds = by_type(status_of(ready, problem=problem))
    assert conds["Ready"]["reason"] == "AllReplicasReady"
    assert conds["Degraded"]["message"] == problem.message
    down = Rollout.from_deployment(deployment(), desired=2)
    assert by_type(status_of(down, problem=problem))["Ready"]["reason"] == "ApplyFailed"


def test_transition_time_changes_only_with_the_status() -> None:
    rollout = Rollout.from_deployment(deployment(readyReplicas=1, updatedReplicas=1), desired=1)
    first = status_of(rollout, now=T0)
    again = status_of(rollout, previous=first, now=T1)
    assert by_type(again)["Ready"]["lastTransitionTime"] == T0
    down = Rollout.from_deployment(deployment(readyReplicas=0, updatedReplicas=1), desired=1)
    flipped = status_of(down, previous=again, now=T1)
    assert by_type(flipped)["Ready"]["lastTransitionTime"] == T1
    assert by_type(flipped)["Degraded"]["lastTransitionTime"] == T0


def test_nothing_progresses_while_a_problem_blocks_the_deployment() -> None:
    problem = Problem("NoPools", "no valid InferencePool matches")
    conds = by_type(status_of(Rollout.from_deployment(None, 1), problem=problem))
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == ("False", "NoPools")
    assert conds["Degraded"]["status"] == "True"


def test_a_problem_message_is_cut_short() -> None:
    """A problem naming every missing Secret of thousands of API keys made a 1 MB status
    patch, which the API server refused."""
    from kvgate.operator.status import MAX_PROBLEM_CHARS, Problem

    problem = Problem("MissingReference", "Secret key-x not found; " * 10_000)
    assert len(problem.message) <= MAX_PROBLEM_CHARS
    assert problem.message.endswith("(240000 characters)")
    assert Problem("Short", "fix it").message == "fix it"


def test_a_tenant_has_at_most_16_api_keys() -> None:
    import pytest
    from pydantic import ValidationError

    from kvgate.api.policy import RoutingPolicySpec

    keys = [{"name": f"k{i}", "key": "v"} for i in range(17)]
    tenants = {"items": [{"name": "t", "apiKeys": keys}]}
    with pytest.raises(ValidationError):
        RoutingPolicySpec.model_validate({"pools": ["p"], "tenants": tenants})
    RoutingPolicySpec.model_validate(
        {"pools": ["p"], "tenants": {"items": [{"name": "t", "apiKeys": keys[:16]}]}}
    )
