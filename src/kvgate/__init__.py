"""kvgate: a prefix-cache-aware, load-aware router for vLLM pods on Kubernetes."""

__version__ = "0.1.0"
