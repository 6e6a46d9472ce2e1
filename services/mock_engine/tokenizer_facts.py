"""What the mock engine learns from its tokenizer folder: vocabulary, special ids, texts.

The tokenizer is loaded with the `tokenizers` package only. The ordinary vocabulary (the ids
the mock engine may emit) is the base vocabulary minus added/special tokens, minus the byte
fragments that do not decode to text on their own, so any emitted sequence detokenizes cleanly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from switchyard.mock_engine.errors import ConfigError


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class TokenizerFacts:
    directory: Path
    tokenizer: Tokenizer
    tokenizer_config: dict[str, Any]  # the folder's tokenizer_config.json as read
    model_config: dict[str, Any]  # the folder's config.json, or {} when it has none
    vocab_size: int  # every id, added tokens included
    eos_token_id: int
    bos_token_id: int
    pad_token_id: int
    special_ids: frozenset[int]
    ordinary_ids: tuple[int, ...]  # sorted; the ids generation may emit

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` the way an engine tokenizes a text prompt (CPU-bound)."""
        return list(self.tokenizer.encode(text).ids)

    def encode_output(self, text: str) -> list[int]:
        """Token ids of generated text (no BOS; special-token markup becomes its own ids)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode_prompt(self, token_ids: list[int] | tuple[int, ...]) -> str:
        """A prompt's text with its special tokens (template markup) kept."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def text_of(self, token_id: int) -> str:
        """The text one token decodes to on its own (ordinary ids decode to whole characters)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ConfigError("tokenizer", f"{path} is not a JSON object")
    return data


@functools.lru_cache(maxsize=4)
def load_tokenizer_facts(directory: Path) -> TokenizerFacts:
    """Load a tokenizer folder (blocking: ~0.3 s for DeepSeek's; call it off the event loop).

    Cached per folder: the files are the model's, fixed for the process's lifetime.
    """
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ConfigError("tokenizer", f"no tokenizer.json in {directory}")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer_config = _read_json(directory / "tokenizer_config.json")
    model_config = _read_json(directory / "config.json")

    def token_id(key: str) -> int | None:
        content = _token_content(tokenizer_config.get(key))
        return tokenizer.token_to_id(content) if content is not None else None

    eos = token_id("eos_token")
    if eos is None and isinstance(model_config.get("eos_token_id"), int):
        eos = model_config["eos_token_id"]
    if eos is None:
        raise ConfigError("tokenizer", f"{directory}: tokenizer_config.json names no eos_token")
    bos = token_id("bos_token")
    if bos is None:
        bos = model_config.get("bos_token_id", eos)
    pad = token_id("pad_token")
    if pad is None:
        pad = eos

    special = frozenset(tokenizer.get_added_tokens_decoder())
    base_ids = sorted(i for i in tokenizer.get_vocab(with_added_tokens=False).values())
    candidates = [i for i in base_ids if i not in special]
    texts = tokenizer.decode_batch([[i] for i in candidates], skip_special_tokens=False)
    ordinary = tuple(
        i for i, text in zip(candidates, texts, strict=True) if text and "\ufffd" not in text
    )
    if not ordinary:
        raise ConfigError("tokenizer", f"{directory}: no ordinary tokens in the vocabulary")
    return TokenizerFacts(
        directory=directory,
        tokenizer=tokenizer,
        tokenizer_config=tokenizer_config,
        model_config=model_config,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        eos_token_id=int(eos),
        bos_token_id=int(bos),
        pad_token_id=int(pad),
        special_ids=special,
        ordinary_ids=ordinary,
    )
