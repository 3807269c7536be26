"""Shared fixtures. Fixtures that start real servers live in tests/integration/conftest.py."""
