"""Pure builders: custom resources in, Kubernetes objects (plain dicts) out. No I/O."""

from kvgate.operator.render.common import Owner
from kvgate.operator.render.config import SelectedPool, router_config
from kvgate.operator.render.engine import engine_selector_string, pool_children
from kvgate.operator.render.router import policy_children

__all__ = [
    "Owner",
    "SelectedPool",
    "engine_selector_string",
    "policy_children",
    "pool_children",
    "router_config",
]
