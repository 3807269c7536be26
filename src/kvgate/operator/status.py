"""Status of pools and policies, computed from what the cluster reports (pure functions).

Three conditions, as users of Deployments expect them:

- **Ready**: the resource can serve traffic. A pool is Ready when at least one engine pod is
  ready (`PartiallyReady` until all are); a policy when at least one router pod is ready and its
  pools have at least one ready endpoint.
- **Progressing**: a rollout or scale is under way (the Deployment has not yet observed its
  generation, or fewer pods are updated/ready than desired).
- **Degraded**: something needs a person: the spec could not be rendered or applied (the
  operator's own error, with its message), a selected pool is missing, or the Deployment
  reports `ReplicaFailure` or `ProgressDeadlineExceeded`.

A condition's `lastTransitionTime` changes only when its status changes, so that
`kubectl describe` shows when a resource last became (un)ready. `status.reason` repeats the
reason that matters (Degraded's while degraded, else Ready's) for the Reason column of
`kubectl get`, which can show only one JSONPath match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.api.base import Condition, ConditionStatus, JsonDict

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"


MAX_PROBLEM_CHARS = 1024
"""A problem's message, as kept, logged and written into two conditions of the status: one
listing every missing Secret of 12,800 API keys made a status patch of 1 MB, refused."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a resource is degraded: a CamelCase reason and a message that says what to fix
    (cut to `MAX_PROBLEM_CHARS`)."""

    reason: str
    message: str

    def __post_init__(self) -> None:
        if len(self.message) > MAX_PROBLEM_CHARS:
            cut = self.message[: MAX_PROBLEM_CHARS - 32]
            object.__setattr__(self, "message", f"{cut}... ({len(self.message)} characters)")


@dataclass(frozen=True, slots=True)
class Rollout:
    """What a Deployment reports, reduced to what the conditions need."""

    desired: int
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    up_to_date: bool = True  # the Deployment controller observed its latest generation
    exists: bool = True  # the Deployment exists
    failure: Problem | None = None  # ReplicaFailure / ProgressDeadlineExceeded

    @classmethod
    def from_deployment(cls, deployment: JsonDict | None, desired: int) -> Rollout:
        if deployment is None:
            return cls(desired=desired, up_to_date=False, exists=False)
        status: dict[str, Any] = deployment.get("status") or {}
        generation = int(deployment.get("metadata", {}).get("generation") or 0)
        failure = None
        # ReplicaFailure (e.g. quota, admission) names the cause; a missed deadline the symptom.
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Progressing" and cond.get("reason") == (
                "ProgressDeadlineExceeded"
            ):
                failure = failure or Problem("ProgressDeadlineExceeded", cond.get("message", ""))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
                failure = Problem(cond.get("reason") or "ReplicaFailure", cond.get("message", ""))
        return cls(
            desired=desired,
            replicas=int(status.get("replicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            updated=int(status.get("updatedReplicas") or 0),
            up_to_date=int(status.get("observedGeneration") or 0) >= generation,
            failure=failure,
        )

    @property
    def progressing(self) -> bool:
        return (not self.up_to_date) or self.updated < self.desired or self.ready < self.desired


def _condition(
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    previous: Sequence[JsonDict],
    now: str,
) -> JsonDict:
    status = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    since = now
    for old in previous:
        if (
            old.get("type") == kind
            and old.get("status") == status
            and old.get("lastTransitionTime")
        ):
            since = str(old["lastTransitionTime"])
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    ).to_wire()


def conditions(
    *,
    ready: tuple[bool, str, str],
    rollout: Rollout,
    problem: Problem | None,
    generation: int,
    previous: Sequence[JsonDict],
    now: str,
) -> list[JsonDict]:
    """Ready, Progressing and Degraded; `ready` is (ok, reason, message) of the caller's rule."""
    if problem is None:
        problem = rollout.failure
    if problem is not None:
        degraded = (True, problem.reason, problem.message)
        if not ready[0]:
            ready = (False, problem.reason, problem.message)
    else:
        degraded = (False, "AsExpected", "")
    if not rollout.exists and problem is not None:
        progressing = (False, problem.reason, "nothing to roll out until the problem is fixed")
    elif not rollout.up_to_date:
        progressing = (True, "RollingOut", "waiting for the Deployment to observe the change")
    elif rollout.progressing:
        progressing = (
            True,
            "RollingOut",
            f"{rollout.updated} updated, {rollout.ready} ready of {rollout.desired} desired",
        )
    else:
        progressing = (False, "Complete", f"{rollout.ready} of {rollout.desired} ready")
    return [
        _condition(READY, *ready, generation, previous, now),
        _condition(PROGRESSING, *progressing, generation, previous, now),
        _condition(DEGRADED, *degraded, generation, previous, now),
    ]


def summary_reason(conditions_: Sequence[JsonDict]) -> str:
    """Degraded's reason while Degraded is True, else Ready's."""
    by_type = {str(c.get("type")): c for c in conditions_}
    degraded = by_type.get(DEGRADED, {})
    if degraded.get("status") == ConditionStatus.TRUE:
        return str(degraded.get("reason") or "")
    return str(by_type.get(READY, {}).get("reason") or "")


def pool_ready(rollout: Rollout) -> tuple[bool, str, str]:
    if rollout.desired == 0:
        return False, "ScaledToZero", "spec.replicas is 0"
    if rollout.ready == 0:
        return False, "NoReadyEngines", f"0 of {rollout.desired} engine pods ready"
    if rollout.ready < rollout.desired:
        return True, "PartiallyReady", f"{rollout.ready} of {rollout.desired} engine pods ready"
    return True, "AllReplicasReady", f"{rollout.ready} of {rollout.desired} engine pods ready"


def policy_ready(rollout: Rollout, endpoints: int) -> tuple[bool, str, str]:
    if rollout.desired == 0:
        return False, "ScaledToZero", "spec.router.replicas is 0"
    if rollout.ready == 0:
        return False, "NoReadyRouters", f"0 of {rollout.desired} router pods ready"
    if endpoints == 0:
        return False, "NoReadyEndpoints", "no engine pod of the selected pools is ready"
    return True, "RouterReady", f"{rollout.ready} router pods, {endpoints} engine endpoints ready"


def pool_status(
    *,
    rollout: Rollout,
    problem: Problem | None,
    generation: int,
    selector: str,
    served_model_name: str,
    previous: JsonDict,
    now: str,
) -> JsonDict:
    found = conditions(
        ready=pool_ready(rollout),
        rollout=rollout,
        problem=problem,
        generation=generation,
        previous=previous.get("conditions") or [],
        now=now,
    )
    return {
        "observedGeneration": generation,
        "replicas": rollout.replicas,
        "readyReplicas": rollout.ready,
        "updatedReplicas": rollout.updated,
        "endpoints": rollout.ready,
        "selector": selector,
        "servedModelName": served_model_name,
        "conditions": found,
        "reason": summary_reason(found),
    }


def policy_status(
    *,
    rollout: Rollout,
    problem: Problem | None,
    generation: int,
    pools: list[str],
    endpoints: int,
    config_hash: str,
    previous: JsonDict,
    now: str,
) -> JsonDict:
    found = conditions(
        ready=policy_ready(rollout, endpoints),
        rollout=rollout,
        problem=problem,
        generation=generation,
        previous=previous.get("conditions") or [],
        now=now,
    )
    return {
        "observedGeneration": generation,
        "pools": pools,
        "poolNames": ",".join(pools),
        "endpoints": endpoints,
        "replicas": rollout.replicas,
        "readyReplicas": rollout.ready,
        "configHash": config_hash,
        "conditions": found,
        "reason": summary_reason(found),
    }
