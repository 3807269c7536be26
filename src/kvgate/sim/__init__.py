"""Simulated vLLM pods: engine model, HTTP server, KV event publisher, fleet, discrete-event mode.

Public names are listed here once. The HTTP side (``kvgate.sim.server``, ``pod``, ``runner``)
is imported only by ``kvgate sim serve|fleet``; see docs/simulator.md.
"""

from kvgate.sim.des import (
    DESFleet,
    FleetDriver,
    FleetResult,
    PodState,
    RequestRecord,
    TraceRequest,
    routed_by,
)
from kvgate.sim.engine import EngineConfig, RequestRejected, SimEngine, StepResult
from kvgate.sim.profile import DEFAULT_PROFILE, H100_LLAMA3_8B, PerformanceProfile, load_profile

__all__ = [
    "DEFAULT_PROFILE",
    "H100_LLAMA3_8B",
    "DESFleet",
    "EngineConfig",
    "FleetDriver",
    "FleetResult",
    "PerformanceProfile",
    "PodState",
    "RequestRecord",
    "RequestRejected",
    "SimEngine",
    "StepResult",
    "TraceRequest",
    "load_profile",
    "routed_by",
]
