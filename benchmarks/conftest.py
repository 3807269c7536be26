"""Benchmarks: `make bench` (pytest-benchmark). They print numbers; they are not timed tests."""
