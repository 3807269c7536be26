"""Workloads, load generator, peers, reports, and the demo."""
