"""Stored responses that do not complete, end to end with the openai SDK, on SQLite and on
PostgreSQL (issue 36: "the response is written at its end, and on failure as failed or
incomplete").

The engine is a mock vLLM engine that hangs after 3 tokens (--hang-after-tokens, a fault
option), and each failing request asks for a deadline (the request-timeout-ms header): once
tokens came, the deadline fails the response mid-generation. The dispatcher's stall watch is
off (--stall-timeout 0), or the hung streams would take the engine out of rotation.

- failed mid-generation, streamed or not: answered and kept as `failed` with its error and
  its output so far; GET returns it; previous_response_id on it continues from it;
- cut by max_output_tokens: kept as `incomplete` with incomplete_details;
- a client that disconnects from a non-background stream: the generation ends and nothing is
  kept (OpenAI keeps a response that outlives its connection only in background mode): GET
  is 404 and previous_response_id on it is 400 previous_response_not_found.
"""

from __future__ import annotations

import contextlib

import httpx
import openai
import pytest
from e2e_stack import LOCAL, Processes, running_stack, wait_until
from support.postgres import PostgresMissing, throwaway_postgres

from switchyard.common.workers import worker_flag

KEY = "sk-failures-e2e"
MODEL = "deepseek-mock"
HANG_AFTER = 3  # tokens the engine generates before it hangs
DEADLINE = {"request-timeout-ms": "1500"}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory):
    with contextlib.ExitStack() as resources:
        if request.param == "sqlite":
            store = ("--data-dir", str(tmp_path_factory.mktemp("failures")))
        else:
            try:
                server = resources.enter_context(throwaway_postgres())
            except PostgresMissing as exc:
                pytest.fail(str(exc), pytrace=False)
            store = ("--postgres-dsn", server.dsn)
        procs = resources.enter_context(Processes())
        engine = procs.serve(
            "hanging-engine", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--kv-events-endpoint", LOCAL, "--kv-replay-endpoint", LOCAL,
            "--hang-after-tokens", str(HANG_AFTER),
        )  # fmt: skip
        url = f"grpc://127.0.0.1:{engine['port']}"
        worker = worker_flag(url, kv_events=engine["kv_events"], kv_replay=engine["kv_replay"])
        up = ("--worker", worker, *store, "--api-key", KEY, "--metrics")
        s = resources.enter_context(running_stack(*up, "--dispatcher-arg=--stall-timeout=0"))
        s.client = resources.enter_context(
            openai.OpenAI(base_url=s.base_url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        )
        yield s


def ask(s, **kw):
    return s.client.responses.create(model=MODEL, temperature=0, **kw)


def active_requests(s) -> float:
    children = s.report()["children"]
    name = next(n for n in children if n.startswith("preprocessor"))
    text = httpx.get(f"http://127.0.0.1:{children[name]['metrics_port']}/metrics").text
    for line in text.splitlines():
        if line.startswith("switchyard_preprocessor_active_requests "):
            return float(line.split()[1])
    raise AssertionError("no switchyard_preprocessor_active_requests")


class TestFailed:
    def test_not_streamed_is_a_failed_response_kept(self, stack):
        reply = ask(stack, input="wagons", max_output_tokens=16, extra_headers=DEADLINE)
        assert reply.status == "failed" and reply.store is True
        assert reply.error.code == "server_error" and reply.incomplete_details is None
        # not streamed, the engine sends its tokens at the end: none came
        assert reply.output[0].status == "incomplete" and reply.output_text == ""
        got = stack.client.responses.retrieve(reply.id)
        assert got.model_dump() == reply.model_dump()

    def test_streamed_is_kept_as_its_failed_event_says(self, stack):
        with ask(
            stack, input="wagons", max_output_tokens=16, stream=True, extra_headers=DEADLINE
        ) as events:
            final = [e for e in events][-1]
        assert final.type == "response.failed"
        got = stack.client.responses.retrieve(final.response.id)
        assert got.status == "failed" and got.error.code == "server_error"
        assert got.model_dump() == final.response.model_dump()
        assert got.output_text == final.response.output_text != ""
        assert got.usage.output_tokens == HANG_AFTER

    def test_chained_from_a_failed_one(self, stack):
        with ask(
            stack, input="first", max_output_tokens=16, stream=True, extra_headers=DEADLINE
        ) as events:
            failed = [e for e in events][-1].response
        assert failed.status == "failed" and failed.output_text != ""
        follow = ask(stack, input="again", max_output_tokens=2, previous_response_id=failed.id)
        assert follow.previous_response_id == failed.id
        items = list(stack.client.responses.input_items.list(follow.id, order="asc"))
        assert [i.role for i in items] == ["user", "assistant", "user"]
        assert items[1].content[0].text == failed.output_text


class TestIncomplete:
    @pytest.mark.parametrize("stream", [False, True])
    def test_cut_by_max_output_tokens(self, stack, stream):
        if stream:
            with ask(stack, input="short", max_output_tokens=2, stream=True) as events:
                reply = [e for e in events][-1].response
        else:
            reply = ask(stack, input="short", max_output_tokens=2)
        assert reply.status == "incomplete"
        got = stack.client.responses.retrieve(reply.id)
        assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
        assert got.model_dump() == reply.model_dump()


class TestDisconnected:
    def test_nothing_is_kept(self, stack):
        response_id = None
        with ask(stack, input="leaving", max_output_tokens=16, stream=True) as events:
            for event in events:  # the engine hangs after its tokens: leave meanwhile
                if event.type == "response.created":
                    response_id = event.response.id
                if event.type == "response.output_text.delta":
                    break
        assert response_id is not None
        wait_until(lambda: active_requests(stack) == 0, what="the request ended")
        with pytest.raises(openai.NotFoundError):
            stack.client.responses.retrieve(response_id)
        with pytest.raises(openai.BadRequestError) as err:
            ask(stack, input="next", max_output_tokens=2, previous_response_id=response_id)
        assert err.value.body["code"] == "previous_response_not_found"
