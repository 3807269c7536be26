"""Simulated vLLM pods: engine model, HTTP server, KV event publisher, fleet, discrete-event mode.

Public names are listed here once. The HTTP side (``kvgate.sim.server``, ``pod``, ``runner``)
is imported only by ``kvgate sim serve|fleet``; see docs/simulator.md.
"""

from kvgate.sim.des import (
    ArrivingRequest,
    DESFleet,
    FleetResult,
    PodState,
    RequestRecord,
    RoutingPolicy,
    TraceRequest,
    least_loaded,
    longest_prefix,
    round_robin,
)
from kvgate.sim.engine import EngineConfig, RequestRejected, SimEngine, StepResult
from kvgate.sim.profile import DEFAULT_PROFILE, H100_LLAMA3_8B, PerformanceProfile, load_profile

__all__ = [
    "DEFAULT_PROFILE",
    "H100_LLAMA3_8B",
    "ArrivingRequest",
    "DESFleet",
    "EngineConfig",
    "FleetResult",
    "PerformanceProfile",
    "PodState",
    "RequestRecord",
    "RequestRejected",
    "RoutingPolicy",
    "SimEngine",
    "StepResult",
    "TraceRequest",
    "least_loaded",
    "load_profile",
    "longest_prefix",
    "round_robin",
]
