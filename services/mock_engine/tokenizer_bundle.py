"""The tokenizer archive GetTokenizer streams, and the model config it carries.

One zip with tokenizer.json, tokenizer_config.json (with a chat template: the folder's own,
else the shipped DeepSeek-V3 one) and config.json at its root, built once in a worker thread
and kept; streamed as slices of at most 64 KiB, the hex SHA-256 of the whole zip on the last.

`directory()` unpacks that same zip into a folder named by its digest under the system's
temporary directory (written once, atomically, shared by every mock serving the same
bundle): what GetModelInfo reports as `tokenizer_path`, so a client that loads the tokenizer
from the reported path gets exactly what GetTokenizer serves, chat template included, as with
a real engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.resources
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from switchyard.mock_engine.tokenizer_facts import TokenizerFacts

CHUNK_SIZE = 64 * 1024
DEFAULT_TEMPLATE = "deepseek_v3.jinja"
DEFAULT_MODEL_TYPE = "deepseek_v3"
DEFAULT_ARCHITECTURES = ("DeepseekV3ForCausalLM",)


def default_chat_template() -> str:
    return (
        importlib.resources.files("switchyard.mock_engine")
        .joinpath("templates", DEFAULT_TEMPLATE)
        .read_text(encoding="utf-8")
    )


def served_model_config(facts: TokenizerFacts, context_length: int) -> dict[str, Any]:
    """config.json as served: the folder's own (if any) with the mock's context length."""
    config = dict(facts.model_config)
    config.setdefault("model_type", DEFAULT_MODEL_TYPE)
    config.setdefault("architectures", list(DEFAULT_ARCHITECTURES))
    config.setdefault("bos_token_id", facts.bos_token_id)
    config.setdefault("eos_token_id", facts.eos_token_id)
    config.setdefault("vocab_size", facts.vocab_size)
    config["max_position_embeddings"] = context_length
    return config


def served_tokenizer_config(facts: TokenizerFacts) -> dict[str, Any]:
    config = dict(facts.tokenizer_config)
    if not config.get("chat_template"):
        config["chat_template"] = default_chat_template()
    return config


def _entry(name: str) -> zipfile.ZipInfo:
    """A zip entry stamped with a fixed time, not the clock's: the same files make the same
    zip, so every mock serving them shares one unpacked folder (named by the digest)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def build_bundle(facts: TokenizerFacts, context_length: int) -> tuple[bytes, str]:
    """The zip's bytes and their hex SHA-256 (blocking: file I/O and deflate)."""
    files: dict[str, bytes | str] = {
        "tokenizer.json": (facts.directory / "tokenizer.json").read_bytes(),
        "tokenizer_config.json": json.dumps(
            served_tokenizer_config(facts), indent=2, ensure_ascii=False
        ),
        "config.json": json.dumps(served_model_config(facts, context_length), indent=2),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(_entry(name), content)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def bundle_slices(data: bytes, sha256: str) -> Iterator[tuple[bytes, str]]:
    """(slice, sha256 or "") pairs: slices of at most CHUNK_SIZE, the digest on the last."""
    total = len(data)
    for offset in range(0, total, CHUNK_SIZE):
        end = min(offset + CHUNK_SIZE, total)
        yield data[offset:end], sha256 if end == total else ""


def unpack_bundle(data: bytes, sha256: str, root: Path | None = None) -> Path:
    """The folder holding the zip's files (blocking: file I/O). Named by the digest, so an
    existing folder already holds exactly these files."""
    root = root or Path(tempfile.gettempdir())
    target = root / f"switchyard-mock-tokenizer-{sha256[:16]}"
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=root))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(staging)
        try:
            os.replace(staging, target)
        except OSError:  # another mock unpacked the same bundle meanwhile
            if not target.is_dir():
                raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return target


class TokenizerBundle:
    """The archive, built on first use in a worker thread and kept; concurrent first callers
    share one build, and a caller that goes away does not cancel it for the others."""

    def __init__(self, facts: TokenizerFacts, context_length: int) -> None:
        self._facts = facts
        self._context_length = context_length
        self._archive: tuple[bytes, str] | None = None
        self._build: asyncio.Task[tuple[bytes, str]] | None = None

    async def archive(self) -> tuple[bytes, str]:
        if self._archive is not None:
            return self._archive
        if self._build is None:
            self._build = asyncio.get_running_loop().create_task(self._build_once())
        return await asyncio.shield(self._build)

    async def directory(self) -> Path:
        """The folder holding exactly the archive's files (see the module docstring)."""
        data, sha256 = await self.archive()
        return await asyncio.to_thread(unpack_bundle, data, sha256)

    async def _build_once(self) -> tuple[bytes, str]:
        try:
            self._archive = await asyncio.to_thread(build_bundle, self._facts, self._context_length)
            return self._archive
        finally:
            self._build = None
