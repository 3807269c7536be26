"""The kopf operator for InferencePool and RoutingPolicy."""
