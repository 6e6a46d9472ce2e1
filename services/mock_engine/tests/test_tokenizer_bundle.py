"""GetTokenizer: one zip in <= 64 KiB slices, sha256 on the last, with a usable chat template."""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from typing import Any

import jinja2
import pytest
from smg_grpc_proto.generated import common_pb2

from switchyard.mock_engine.config import default_tokenizer_dir
from switchyard.mock_engine.tokenizer_bundle import (
    CHUNK_SIZE,
    build_bundle,
    bundle_slices,
    default_chat_template,
)
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts


async def fetch(stub: Any) -> list[Any]:
    return [chunk async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]


@pytest.mark.asyncio(loop_scope="module")
class TestGetTokenizer:
    async def test_zip_slices_and_digest(self, sglang: Any, vllm: Any) -> None:
        for stub in (sglang, vllm):
            await self.check_bundle(stub)

    async def check_bundle(self, stub: Any) -> None:
        chunks = await fetch(stub)
        assert len(chunks) > 1
        assert all(len(c.data) <= CHUNK_SIZE for c in chunks)
        assert all(c.sha256 == "" for c in chunks[:-1])
        data = b"".join(c.data for c in chunks)
        assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= names
            tokenizer_config = json.loads(archive.read("tokenizer_config.json"))
            model_config = json.loads(archive.read("config.json"))
        assert "<｜Assistant｜>" in tokenizer_config["chat_template"]
        assert model_config["model_type"] == "deepseek_v3"
        assert model_config["max_position_embeddings"] == 512  # the fixture's context length
        assert (model_config["bos_token_id"], model_config["eos_token_id"]) == (0, 1)

    async def test_same_bytes_every_time(self, sglang: Any) -> None:
        first, second = await fetch(sglang), await fetch(sglang)
        assert first[-1].sha256 == second[-1].sha256

    async def test_tokenizer_path_holds_exactly_what_get_tokenizer_serves(
        self, sglang: Any, vllm: Any
    ) -> None:
        """Regression: the reported folder had no chat template while the bundle did, so a
        client loading the tokenizer from tokenizer_path (as other gateways do) got none."""
        from pathlib import Path

        from smg_grpc_proto import sglang_scheduler_pb2, vllm_engine_pb2

        for stub, proto in ((sglang, sglang_scheduler_pb2), (vllm, vllm_engine_pb2)):
            info = await stub.GetModelInfo(proto.GetModelInfoRequest())
            folder = Path(info.tokenizer_path)
            data = b"".join(c.data for c in await fetch(stub))
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                served = {name: archive.read(name) for name in archive.namelist()}
            on_disk = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
            assert on_disk == served
            assert json.loads(on_disk["tokenizer_config.json"])["chat_template"]


class TestBuild:
    def test_same_files_same_zip_at_any_time(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Regression: entries were stamped with the clock, so each mock start built a zip of
        its own digest and unpacked another folder (~7 MB) into the temporary directory."""
        facts = load_tokenizer_facts(default_tokenizer_dir())
        first = build_bundle(facts, 512)
        later = time.time() + 86400 * 400  # the zip format stamps to 2 s: a day apart
        monkeypatch.setattr(time, "time", lambda: later)
        assert build_bundle(facts, 512) == first


class TestSlices:
    def test_digest_on_last_only(self) -> None:
        pieces = list(bundle_slices(b"x" * (CHUNK_SIZE * 2 + 1), "abc"))
        assert [len(p) for p, _ in pieces] == [CHUNK_SIZE, CHUNK_SIZE, 1]
        assert [d for _, d in pieces] == ["", "", "abc"]


class TestChatTemplate:
    BOS = "<｜begin▁of▁sentence｜>"

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        template = jinja2.Environment().from_string(default_chat_template())
        return template.render(
            bos_token=self.BOS, messages=messages, add_generation_prompt=add_generation_prompt
        )

    def test_deepseek_v3_shape(self) -> None:
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]
        assert self.render(messages, True) == (
            f"{self.BOS}Be brief.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
            "<｜User｜>Bye<｜Assistant｜>"
        )

    def test_a_user_turn_ends_with_the_assistant_marker(self) -> None:
        # As in DeepSeek-V3's own template, whatever add_generation_prompt says.
        rendered = self.render([{"role": "user", "content": "Hi"}], False)
        assert rendered == f"{self.BOS}<｜User｜>Hi<｜Assistant｜>"

    def test_same_template_as_the_preprocessor_default(self) -> None:
        from switchyard.preprocessor.chat_template import default_template_source

        assert default_chat_template() == default_template_source()
