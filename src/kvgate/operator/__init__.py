"""The kopf operator for InferencePool and RoutingPolicy (`kopf run -m kvgate.operator`).

Importing this package registers the handlers: `startup` (settings, API client and the
reconciler in `memo`), `pools`, `policies`, `children` and `gateway_pools` (thin kopf handlers). The logic lives
in `reconcile` (kopf-free, tested with a fake API), the objects in `render` (pure builders) and
`status` (pure condition rules).
"""

from kvgate.operator import children, gateway_pools, policies, pools, startup

__all__ = ["children", "gateway_pools", "policies", "pools", "startup"]
