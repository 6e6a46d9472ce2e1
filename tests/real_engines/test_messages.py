"""The Anthropic Messages API with the anthropic SDK, Switchyard over the real gRPC engines vs
vLLM's own server (its /v1/messages) on the same model, greedy: the same text, stop reason
and token counts, streamed and not, and count_tokens equal to what a message bills on both.

(A tool loop is not compared: vLLM hands the chat template an earlier call's arguments as a
map, which the DeepSeek-V3 template of the test model concatenates as a string; the
mock-engine suite covers Switchyard's tool loop.)"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

MODEL = "tiny-llama"
GREEDY = {"temperature": 0}  # a field the SDK no longer names
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ours(stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.base_url, api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def theirs(http_c) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=http_c.url, api_key="none", max_retries=0) as c:
        yield c


def billed(message) -> int:
    u = message.usage
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


ASK = {
    "model": MODEL,
    "system": [{"type": "text", "text": "You keep the yard's books."}],
    "messages": [{"role": "user", "content": "Which siding takes the grain cars?"}],
}


class TestMessagesApi:
    def test_create_matches_vllms_own_server(self, ours, theirs):
        mine = ours.messages.create(max_tokens=12, extra_body=GREEDY, **ASK)
        vllm = theirs.messages.create(max_tokens=12, extra_body=GREEDY, **ASK)
        assert text_of(mine) == text_of(vllm)
        assert mine.stop_reason == vllm.stop_reason
        assert mine.usage.output_tokens == vllm.usage.output_tokens
        assert billed(mine) == billed(vllm)
        assert mine.id.startswith("msg_")

    def test_stream_is_the_same_answer(self, ours, theirs):
        whole = ours.messages.create(max_tokens=16, extra_body=GREEDY, **ASK)
        with ours.messages.stream(max_tokens=16, extra_body=GREEDY, **ASK) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        with theirs.messages.stream(max_tokens=16, extra_body=GREEDY, **ASK) as stream:
            vllm = "".join(stream.text_stream)
        assert streamed == text_of(whole) == text_of(final) == vllm
        assert final.usage.output_tokens == whole.usage.output_tokens

    def test_count_tokens_is_what_a_message_bills(self, ours, theirs):
        mine = ours.messages.count_tokens(**ASK)
        vllm = theirs.messages.count_tokens(**ASK)
        message = ours.messages.create(max_tokens=2, extra_body=GREEDY, **ASK)
        assert mine.input_tokens == vllm.input_tokens == billed(message)

    def test_stop_sequence(self, ours):
        whole = text_of(ours.messages.create(max_tokens=16, extra_body=GREEDY, **ASK))
        assert len(whole) >= 6, whole  # 16 tokens of random weights
        stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
        cut = ours.messages.create(max_tokens=16, extra_body=GREEDY, stop_sequences=[stop], **ASK)
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
        assert text_of(cut) == whole[: whole.index(stop)]
