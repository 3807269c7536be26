"""Pydantic models: CRD specs and status, router configuration. Imports nothing else of kvgate."""
