"""The Anthropic Messages API over a fleet, with the anthropic SDK: `metadata.user_id` is the
router's session key (the session table the Messages requests filled is what /debug/route
scores for a chat request of that `user`), and an engine that dies inside a stream with no
other engine for its model ends the stream with an `error` event in Anthropic's shape, after
the events already sent. Messages requests count in the preprocessor's request metrics."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from e2e_stack import Processes, running_stack, wait_until
from prometheus_client.parser import text_string_to_metric_families
from test_capability_routing import access, worker_ids

MODEL = "deepseek-mock"
CRASHY = "crashy-mock"  # one engine, which exits after a few tokens
pytestmark = pytest.mark.timeout(300)


STORY = "Once upon a time a small engine pulled long trains across the yard, day after day."


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    script = tmp_path_factory.mktemp("anthropic-fleet") / "script.json"
    script.write_text(json.dumps([{"marker": "long story", "output": STORY}]))
    with Processes() as procs:
        # A scripted answer (no early end of sequence) longer than the engine lives.
        crashy = procs.start_ready(
            "engine-crashy", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--model-name", CRASHY, "--script", str(script),
            "--exit-after-tokens", "4", "--itl-ms", "100",
        ).result()  # fmt: skip
        crashy_url = f"grpc://127.0.0.1:{crashy['port']}"
        with running_stack(
            "--mock-engines", "sglang,vllm,sglang", "--worker", crashy_url, "--log-format", "json"
        ) as stack:
            wait_until(lambda: len(worker_ids(stack.base_url)) == 4, what="four engines ready")
            stack.anthropic = anthropic.Anthropic(
                base_url=stack.base_url, api_key="x", max_retries=0
            )
            try:
                yield stack
            finally:
                stack.anthropic.close()


def route_scores(base: str, user: str) -> dict[str, float]:
    """/debug/route of a chat request whose `user` is the session key: url -> its score."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "user": user}
    route = httpx.post(base + "/debug/route", json=body, timeout=30).json()
    return {w["url"]: w["scores"]["session_affinity"] for w in route["workers"]}


def requests_total(base: str, **labels: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "switchyard_preprocessor_requests_total"
        and all(s.labels.get(k) == v for k, v in labels.items())
    )


class TestSessionKey:
    def test_metadata_user_id_sticks_to_one_engine(self, fleet):
        assert set(route_scores(fleet.base_url, "user-7").values()) == {0.0}  # no session yet
        served = set()
        for n in range(4):  # unrelated prompts: only the user ties them together
            message = fleet.anthropic.messages.create(
                model=MODEL,
                max_tokens=2,
                messages=[{"role": "user", "content": f"Question {n * 977} of many?"}],
                metadata={"user_id": "user-7"},
                extra_headers={"x-request-id": f"session-{n}"},
            )
            assert message.usage.output_tokens >= 1
            served.add(access(fleet, f"session-{n}")["worker"])
        assert len(served) == 1
        scores = route_scores(fleet.base_url, "user-7")
        assert scores[served.pop()] == 1.0 and sorted(scores.values()) == [0.0, 0.0, 1.0]
        assert set(route_scores(fleet.base_url, "someone-else").values()) == {0.0}
        answered = requests_total(fleet.base_url, endpoint="messages", model=MODEL, status="200")
        assert answered >= 4  # the chat metrics count Messages requests under their endpoint


class TestErrorInsideAStream:
    def test_engine_dies_with_nowhere_to_migrate(self, fleet):
        seen = []
        with pytest.raises(anthropic.APIStatusError) as err:
            for event in fleet.anthropic.messages.create(
                model=CRASHY,
                max_tokens=64,
                messages=[{"role": "user", "content": "Tell me a long story."}],
                stream=True,
            ):
                seen.append(event.type)
        assert seen[0] == "message_start" and "message_stop" not in seen
        assert err.value.response.status_code == 200  # the stream had begun
        body = err.value.body
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] in ("overloaded_error", "api_error")
        assert body["error"]["message"]
