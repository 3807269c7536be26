"""Shared test data for kvgate.prefix: the small BPE tokenizer and agent conversations."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

# transformers only ever reads the local test tokenizer; never let it look for a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(__file__).parents[2] / "data" / "prefix"
TOKENIZER_DIR = DATA / "tokenizer"


@pytest.fixture(scope="session")
def conversations() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / "conversations.json").read_text())
    return loaded


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """transformers' own tokenizer for the test directory (the reference kvgate must match)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
