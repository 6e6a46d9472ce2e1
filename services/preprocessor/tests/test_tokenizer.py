from __future__ import annotations

import asyncio
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from switchyard.preprocessor.errors import TokenizerLoadError
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

BOS = "<｜begin▁of▁sentence｜>"


def zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tokenizer_files() -> dict[str, bytes]:
    folder = default_tokenizer_dir()
    return {
        "tokenizer.json": (folder / "tokenizer.json").read_bytes(),
        "tokenizer_config.json": (folder / "tokenizer_config.json").read_bytes(),
    }


class TestDefaultDir:
    def test_has_the_files(self) -> None:
        folder = default_tokenizer_dir()
        assert (folder / "tokenizer.json").is_file()
        assert (folder / "tokenizer_config.json").is_file()


class TestBundle:
    def test_special_ids(self, bundle: TokenizerBundle) -> None:
        assert bundle.bos_token_id == 0
        assert bundle.eos_token_ids == (1,)
        assert bundle.vocab_size >= 129_000
        assert bundle.chat_template.is_default

    def test_encode_adds_no_bos(self, bundle: TokenizerBundle) -> None:
        ids = bundle.encode("Hello world")
        assert ids and ids[0] != bundle.bos_token_id
        assert bundle.decode(ids) == "Hello world"

    def test_encode_recognises_bos_text(self, bundle: TokenizerBundle) -> None:
        assert bundle.encode(BOS + "Hi")[0] == 0

    @pytest.mark.parametrize("offload_chars", [0, 10**9])
    async def test_encode_async_gives_the_same_ids(
        self, bundle: TokenizerBundle, offload_chars: int
    ) -> None:
        text = BOS + "Rail yards sort freight cars onto tracks. " * 200
        ids = await bundle.encode_async(text, offload_chars=offload_chars)
        assert ids == bundle.encode(text)

    async def test_a_long_text_is_encoded_while_the_loop_runs(
        self, bundle: TokenizerBundle
    ) -> None:
        """Off the loop (and without the GIL): a ticker task keeps ticking meanwhile."""
        text = "switch track signal " * 40_000
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        await bundle.encode_async(text, offload_chars=0)
        offloaded = ticks - before
        before = ticks
        await bundle.encode_async(text, offload_chars=len(text) + 1)  # inline: no ticks
        inline = ticks - before
        done = True
        await task
        assert inline == 0
        assert offloaded > 10

    def test_missing_tokenizer_json(self, tmp_path: Path) -> None:
        with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
            TokenizerBundle.from_dir(tmp_path)

    def test_model_and_generation_config_eos_merged(
        self, tmp_path: Path, tokenizer_files: dict[str, bytes]
    ) -> None:
        for name, data in tokenizer_files.items():
            (tmp_path / name).write_bytes(data)
        (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
        bundle = TokenizerBundle.from_dir(tmp_path)
        assert bundle.eos_token_ids == (1, 7, 9)
        assert bundle.model_config == {"eos_token_id": [1, 7]}

    def test_chat_template_jinja_file(
        self, tmp_path: Path, tokenizer_files: dict[str, bytes]
    ) -> None:
        for name, data in tokenizer_files.items():
            (tmp_path / name).write_bytes(data)
        (tmp_path / "chat_template.jinja").write_text("T:{{ messages[0]['content'] }}")
        bundle = TokenizerBundle.from_dir(tmp_path)
        assert not bundle.chat_template.is_default
        assert bundle.chat_template.render([{"role": "user", "content": "x"}]) == "T:x"


class TestFromZip:
    def test_round_trip_with_sha(self, tmp_path: Path, tokenizer_files: dict[str, bytes]) -> None:
        data = zip_of(tokenizer_files)
        bundle = TokenizerBundle.from_zip_bytes(
            data, tmp_path / "tok", sha256=hashlib.sha256(data).hexdigest()
        )
        assert bundle.path == tmp_path / "tok"
        assert (
            bundle.encode("Hello world")
            == bundle.tokenizer.encode("Hello world", add_special_tokens=False).ids
        )

    def test_files_in_one_subfolder(
        self, tmp_path: Path, tokenizer_files: dict[str, bytes]
    ) -> None:
        data = zip_of({f"model/{k}": v for k, v in tokenizer_files.items()})
        bundle = TokenizerBundle.from_zip_bytes(data, tmp_path)
        assert bundle.path == tmp_path / "model"

    def test_sha_mismatch(self, tmp_path: Path, tokenizer_files: dict[str, bytes]) -> None:
        with pytest.raises(TokenizerLoadError, match="sha256"):
            TokenizerBundle.from_zip_bytes(zip_of(tokenizer_files), tmp_path, sha256="00" * 32)

    @pytest.mark.parametrize(
        "name", ["../evil.txt", "a/../../evil.txt", "/etc/evil.txt", "..\\evil.txt", "C:/evil.txt"]
    )
    def test_refuses_escaping_paths(self, tmp_path: Path, name: str) -> None:
        dest = tmp_path / "dest"
        with pytest.raises(TokenizerLoadError, match="outside the destination"):
            TokenizerBundle.from_zip_bytes(zip_of({name: b"x"}), dest)
        assert not (tmp_path / "evil.txt").exists()
        assert not dest.exists()

    def test_not_a_zip(self, tmp_path: Path) -> None:
        with pytest.raises(TokenizerLoadError, match="not a zip"):
            TokenizerBundle.from_zip_bytes(b"definitely not a zip", tmp_path)

    def test_zip_without_tokenizer(self, tmp_path: Path) -> None:
        with pytest.raises(TokenizerLoadError, match="no tokenizer.json"):
            TokenizerBundle.from_zip_bytes(zip_of({"README": b"x"}), tmp_path)
