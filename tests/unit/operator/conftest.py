"""Fixtures of the operator unit tests."""

from __future__ import annotations

import pytest
from fake_kube import Events, FakeKube


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def events() -> Events:
    return Events()
