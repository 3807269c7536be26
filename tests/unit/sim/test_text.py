from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.sim.openai import BadRequest, parse_request
from kvgate.sim.text import ChunkCodec, PrefixCodec, load_codec

TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "prefix" / "tokenizer"


def test_model_directory_brings_its_tokenizer_and_chat_template() -> None:
    codec = load_codec(None, str(TOKENIZER), 32000)
    assert isinstance(codec, PrefixCodec)
    body = {"messages": [{"role": "user", "content": "hello there"}]}
    ids = codec.chat_token_ids(body)
    text = codec.requests.chat_text(body)
    assert "hello there" in text and ids == codec.tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= t < codec.vocab_size for t in ids)


def test_without_tokenizer_files_the_stand_in_is_deterministic() -> None:
    codec = load_codec(None, "org/model-without-files", 32000)
    assert isinstance(codec, ChunkCodec)
    ids = codec.completion_token_ids({"prompt": "abcdefgh" * 10})
    assert ids == codec.completion_token_ids({"prompt": "abcdefgh" * 10})
    assert len(ids[0]) == 20  # 4 characters per token
    assert codec.completion_token_ids({"prompt": [5, 6, 7]}) == [[5, 6, 7]]
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert codec.chat_token_ids(chat) == codec.encode("<|user|>\nhi\n<|assistant|>\n")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"[1, 2]", "JSON object"),
        (b'{"prompt": ["a", "b"]}', "one prompt"),
        (b'{"prompt": "x", "n": 2}', "n=1"),
        (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream=True"),
        (b'{"prompt": "x", "cache_salt": ""}', "cache_salt"),
        (b'{"prompt": {"a": 1}}', "prompt"),
    ],
)
def test_bad_completion_bodies_are_400s(raw: bytes, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment):
        parse_request(raw, chat=False, codec=ChunkCodec())


def test_chat_max_completion_tokens_wins_and_extra_fields_are_ignored() -> None:
    raw = (
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,'
        b' "max_completion_tokens": 3, "rid": "x", "return_hidden_states": false}'
    )
    parsed = parse_request(raw, chat=True, codec=ChunkCodec())
    assert parsed.max_tokens == 3 and parsed.chat and not parsed.stream
