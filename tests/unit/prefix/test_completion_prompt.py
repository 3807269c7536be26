"""vLLM 0.33's reading of a completion `prompt`, table-driven, and its three users agreeing.

The expected column is what vLLM does (read from vllm/entrypoints/openai/completion/protocol.py,
vllm/renderers/inputs/preprocess.py and vllm/renderers/base.py): the prompts it runs, or the
start of the 400 message it answers with. With a vLLM 0.33 wheel at hand the annotation the rule
reproduces is compared with the wheel's source.
"""

from __future__ import annotations

import re
import zipfile
from typing import Any

import pytest
from tests.vllm_wheel import vllm_wheel

from kvgate.api.router_config import EngineConfig
from kvgate.prefix import PromptError, completion_prompts
from kvgate.router.core.errors import RouterError
from kvgate.router.core.keys import Keyer
from kvgate.sim.text import ChunkCodec

BAD_SHAPE = "prompt must be a string"
EMPTY = "The decoder prompt cannot be empty"
OOV = "Token id"

# (prompt, vocab_size, the prompts vLLM runs or the start of its error)
CASES: list[tuple[Any, int | None, list[Any] | str]] = [
    ("hello", None, ["hello"]),
    (["a", "b"], None, ["a", "b"]),
    ([1, 2, 3], None, [[1, 2, 3]]),
    ([0], None, [[0]]),
    ([[1, 2]], None, [[1, 2]]),  # a batch of one
    ([[1, 2], [3]], None, [[1, 2], [3]]),  # a batch of two
    ([], None, []),  # a batch of none
    ([[]], None, EMPTY),
    ([[1], []], None, EMPTY),
    ([True, False], None, [[1, 0]]),  # pydantic's lax int: bools are 1 and 0
    ([1, True], None, [[1, 1]]),
    ([[True]], None, [[1]]),
    ([1.0, 2.0], None, [[1, 2]]),  # integral floats are ints
    ([1.5], None, BAD_SHAPE),
    ([1, "2"], None, [[1, 2]]),  # no strict match: lax list[int] coerces "2"
    (["1", "2"], None, ["1", "2"]),  # strict list[str] wins: two texts
    (["a", 1], None, BAD_SHAPE),
    (["a", [1]], None, BAD_SHAPE),  # texts and token ids never mix
    ([[1], "a"], None, BAD_SHAPE),
    ([-1], None, BAD_SHAPE),
    ([[-1]], None, BAD_SHAPE),
    ([None], None, BAD_SHAPE),
    ({"a": 1}, None, BAD_SHAPE),
    (7, None, BAD_SHAPE),
    (None, None, "Either prompt or prompt_embeds"),
    ("", None, "Either prompt or prompt_embeds"),
    ([2**63 - 1], None, [[2**63 - 1]]),
    ([2**63], None, OOV),  # beyond every vocabulary (int64 ids)
    ([[5], [2**64]], None, OOV),
    ([31999], 32000, [[31999]]),
    ([32000], 32000, OOV),
    ([[1], [32000]], 32000, OOV),
    ([True], 1, OOV),  # True is token 1
]


@pytest.mark.parametrize(("prompt", "vocab", "expected"), CASES, ids=[repr(c[0]) for c in CASES])
def test_vllm_rule(prompt: Any, vocab: int | None, expected: list[Any] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(PromptError, match=f"^{re.escape(expected)}"):
            completion_prompts(prompt, vocab_size=vocab)
    else:
        assert completion_prompts(prompt, vocab_size=vocab) == expected


@pytest.mark.parametrize(("prompt", "vocab", "expected"), CASES, ids=[repr(c[0]) for c in CASES])
def test_router_routes_by_the_first_prompt_vllm_runs(
    prompt: Any, vocab: int | None, expected: list[Any] | str
) -> None:
    keyer = Keyer(EngineConfig(block_size=1))
    if vocab is not None:
        return  # the router does not know the engines' vocabulary
    if isinstance(expected, str) or not expected:
        with pytest.raises(RouterError) as exc:
            keyer.keys({"prompt": prompt}, "completion", None)
        assert exc.value.status == 400
        return
    keys = keyer.keys({"prompt": prompt}, "completion", None)
    first = expected[0]
    assert keys.exact == isinstance(first, list)
    if isinstance(first, list):
        assert keys.block_keys == keyer.hasher.block_keys(first)


@pytest.mark.parametrize(("prompt", "vocab", "expected"), CASES, ids=[repr(c[0]) for c in CASES])
def test_simulator_takes_what_vllm_takes(
    prompt: Any, vocab: int | None, expected: list[Any] | str
) -> None:
    codec = ChunkCodec(vocab_size=vocab or 2**63)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
            codec.completion_token_ids({"prompt": prompt})
        return
    want = [codec.encode(p) if isinstance(p, str) else p for p in expected]
    assert codec.completion_token_ids({"prompt": prompt}) == want


def test_exact_ints_take_the_fast_path_unchanged() -> None:
    ids = list(range(50_000))
    (out,) = completion_prompts(ids)
    assert out is ids  # not copied: the common case costs one pass in C


def test_rule_reads_the_annotation_vllm_declares() -> None:
    with zipfile.ZipFile(vllm_wheel()) as zf:
        source = zf.read("vllm/entrypoints/openai/completion/protocol.py").decode()
        preprocess = zf.read("vllm/renderers/inputs/preprocess.py").decode()
    found = re.search(r"class CompletionRequest\(.*?\n    prompt: \((.*?)\) = None", source, re.S)
    assert found is not None
    annotation = " ".join(found.group(1).split())
    assert annotation == (
        "list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] "
        "| str | list[str] | None"
    )
    assert "len(prompt_or_prompts) > 0 and is_list_of(prompt_or_prompts, int)" in preprocess
