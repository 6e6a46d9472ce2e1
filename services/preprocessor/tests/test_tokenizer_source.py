"""ModelTokenizers: one tokenizer per served model, from folders or from the model's engines."""

import asyncio
from pathlib import Path

import pytest
from support.mock_engine import tokenizer_dir_with_template

from switchyard.preprocessor.tokenizer import default_tokenizer_dir
from switchyard.preprocessor.tokenizer_source import ModelTokenizers, parse_tokenizer_flags

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


@pytest.fixture
def other_dir(tmp_path: Path) -> Path:
    """The shipped tokenizer with a chat template of its own."""
    return tokenizer_dir_with_template(tmp_path / "other", TEMPLATE)


async def until(predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class TestFlags:
    def test_bare_folder_is_for_every_model(self):
        assert parse_tokenizer_flags(["/t"]) == (Path("/t"), {})

    def test_model_folders(self):
        assert parse_tokenizer_flags(["a=/x", "/t", "b=/y"]) == (
            Path("/t"),
            {"a": Path("/x"), "b": Path("/y")},
        )

    @pytest.mark.parametrize(
        ("value", "says"), [("=/t", "a model name before"), ("m=", "a folder after")]
    )
    def test_a_half_missing_model_folder_is_named(self, value, says):
        with pytest.raises(ValueError, match=f"MODEL=DIR needs {says} the '='"):
            parse_tokenizer_flags([value])

    def test_two_folders_for_every_model_is_an_error(self):
        with pytest.raises(ValueError):
            parse_tokenizer_flags(["/t", "/u"])


class TestModelTokenizers:
    async def test_models_sharing_a_folder_share_one_bundle(self):
        tokenizers = ModelTokenizers(dict, default_tokenizer_dir())
        tokenizers.sync(["a", "b"])
        await until(lambda: tokenizers.loaded() == {"a", "b"})
        assert tokenizers.get("a") is tokenizers.get("b")
        assert tokenizers.get("c") is None
        await tokenizers.close()

    async def test_a_model_with_its_own_folder_gets_its_own_template(self, other_dir):
        tokenizers = ModelTokenizers(dict, default_tokenizer_dir(), {"b": other_dir})
        tokenizers.sync(["a", "b"])
        await until(lambda: tokenizers.loaded() == {"a", "b"})
        a, b = tokenizers.get("a"), tokenizers.get("b")
        assert a is not None and b is not None
        messages = [{"role": "user", "content": "hi"}]
        assert b.chat_template.render(messages) == "[user] hi\n"
        assert a.chat_template.render(messages) != b.chat_template.render(messages)
        await tokenizers.close()

    async def test_a_bad_folder_leaves_the_model_unloaded(self, tmp_path):
        tokenizers = ModelTokenizers(dict, tmp_path / "missing")
        tokenizers.sync(["a"])
        await asyncio.sleep(0.2)
        assert tokenizers.loaded() == set()
        await tokenizers.close()

    async def test_fetching_stops_when_the_model_is_gone(self):
        # No engine serves "a": the fetch keeps retrying until the model leaves.
        tokenizers = ModelTokenizers(dict, retry_interval=0.01)
        tokenizers.sync(["a"])
        await asyncio.sleep(0.05)
        assert tokenizers._loading
        tokenizers.sync([])
        await asyncio.sleep(0.05)
        assert not tokenizers._loading and tokenizers.loaded() == set()
        await tokenizers.close()
