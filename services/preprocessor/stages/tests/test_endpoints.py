"""`serve` end to end over fake router/dispatcher clients: the stages in order, the token
loop, migration, the watchdog, and how failures reach the client."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from switchyard.common import errors
from switchyard.preprocessor.prefill_hop import PREFILL_SUFFIX
from switchyard.preprocessor.stages import endpoints
from switchyard.preprocessor.stages.context import CHAT, COMPLETIONS
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    chat_body,
    deps,
    done,
    failed,
    serve,
    tokens,
)
from switchyard.preprocessor.tokenizer import TokenizerBundle

pytestmark = pytest.mark.timeout(30)


def ids_of(bundle: TokenizerBundle, text: str) -> list[int]:
    return bundle.encode(text)


async def run(
    d, body: bytes, endpoint: str = CHAT, session_id: str | None = None
) -> tuple[int, FakeHttp]:
    http = FakeHttp()
    status = await serve(d, endpoint, body, http, session_id)
    return status, http


def content(http: FakeHttp) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in http.events()
        if e != "[DONE]" and e.get("choices")
    )


class TestStream:
    async def test_text_usage_and_finish(self, bundle):
        ids = ids_of(bundle, "Hello there, friend")

        def script(req):
            return [tokens(req.request_id, i) for i in ids] + [done(req.request_id, cached=3)]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
        status, http = await run(d, chat_body(stream=True, stream_options={"include_usage": True}))
        assert status == 200 and http.ended
        assert content(http) == "Hello there, friend"
        events = http.events()
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert events[-3]["choices"][0]["finish_reason"] == "length"
        usage = events[-2]["usage"]
        assert usage["completion_tokens"] == len(ids)
        assert usage["prompt_tokens_details"]["cached_tokens"] == 3  # of a 4-token prompt
        assert events[-1] == "[DONE]"

    async def test_replies_that_arrive_together_are_one_write(self, bundle):
        """Regression guard for the per-token path: a batch of queued replies is processed
        in one pass and written once (role chunk, content, finish and [DONE] together)."""

        def script(req):
            return [tokens(req.request_id, 7), tokens(req.request_id, 8), done(req.request_id)]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
        _, http = await run(d, chat_body(stream=True))
        assert len(http.writes) == 2  # the batch, then usage-less [DONE]
        assert http.writes[0].count(b"data: ") == 3  # role + content + finish

    async def test_router_hears_of_the_first_token_and_the_end(self, bundle):
        router = FakeRouter([1])
        d = deps(
            bundle, router, FakeDispatcher(lambda r: [tokens(r.request_id, 7), done(r.request_id)])
        )
        await run(d, chat_body(stream=True))
        stages = [stage for _, stage in router.progress_log]
        assert stages == ["first_token", "finished"]

    async def test_not_streaming(self, bundle):
        ids = ids_of(bundle, "plain answer")
        d = deps(
            bundle,
            FakeRouter([1]),
            FakeDispatcher(lambda r: [tokens(r.request_id, *ids), done(r.request_id, "stop")]),
        )
        status, http = await run(d, chat_body())
        body = http.json()
        assert status == 200
        assert body["choices"][0]["message"]["content"] == "plain answer"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == len(ids)

    async def test_completions_with_token_ids(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: [done(r.request_id)]))
        dispatcher = d.dispatcher
        status, http = await run(
            d, b'{"model": "m", "prompt": [5, 6, 7], "max_tokens": 2}', COMPLETIONS
        )
        assert status == 200 and http.json()["object"] == "text_completion"
        assert dispatcher.requests[0].token_ids == [5, 6, 7]
        assert dispatcher.requests[0].sampling.max_tokens == 2


class TestStopStrings:
    async def test_stop_trims_and_cancels_the_engine_request(self, bundle):
        ids = ids_of(bundle, "one two STOP three four")
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, i) for i in ids])
        d = deps(bundle, FakeRouter([1]), dispatcher)
        _, http = await run(d, chat_body(stream=True, stop=["STOP"]))
        assert content(http) == "one two "
        assert http.events()[-2]["choices"][0]["finish_reason"] == "stop"
        assert dispatcher.streams[0].cancelled


class TestStopTokenIds:
    """A stop_token_ids token that ends the output is left out of the text, as vLLM's and
    SGLang's own servers do (the real-engine suite found Switchyard sent it)."""

    @pytest.mark.parametrize("stream", [True, False])
    @pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
    async def test_the_matched_stop_token_has_no_text(self, bundle, stream, endpoint):
        ids = ids_of(bundle, "one two three")
        stop = ids[-1]

        def script(req):
            return [tokens(req.request_id, i) for i in ids] + [
                done(req.request_id, "stop", matched=stop)
            ]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
        fields = {"stream": stream, "stop_token_ids": [stop]}
        body = chat_body(**fields)
        if endpoint == COMPLETIONS:
            body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 8, **fields})
        status, http = await run(d, body, endpoint)
        assert status == 200
        if stream:
            text = "".join(
                e["choices"][0].get("text", "")
                or e["choices"][0].get("delta", {}).get("content", "")
                or ""
                for e in http.events()
                if e != "[DONE]" and e.get("choices")
            )
        else:
            choice = http.json()["choices"][0]
            text = choice["text"] if endpoint == COMPLETIONS else choice["message"]["content"]
            assert http.json()["usage"]["completion_tokens"] == len(ids)  # it still counts
        assert text == "one two"

    async def test_a_stop_token_that_did_not_end_the_output_keeps_its_text(self, bundle):
        """min_tokens: the engine goes on past a stop token; its text is sent after all."""
        ids = ids_of(bundle, "one two three")

        def script(req):
            return [tokens(req.request_id, i) for i in ids] + [done(req.request_id, "length")]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
        body = chat_body(stream=True, stop_token_ids=[ids[0], ids[-1]], min_tokens=3)
        _, http = await run(d, body)
        assert content(http) == "one two three"


class TestIncompleteCharacterAtTheEnd:
    @pytest.mark.parametrize("stream", [True, False])
    async def test_is_dropped_as_vllms_server_does(self, bundle, stream):
        """An output cut inside a multi-byte character ends without U+FFFD: vLLM's server
        drops the incomplete bytes (the real-engine suite found Switchyard sent U+FFFD)."""
        ids = ids_of(bundle, "ok") + ids_of(bundle, "😀")[:1]

        def script(req):
            return [tokens(req.request_id, *ids), done(req.request_id, "length")]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
        _, http = await run(d, chat_body(stream=stream))
        text = content(http) if stream else http.json()["choices"][0]["message"]["content"]
        assert text == "ok"


class TestRouteHints:
    """What the router is told (the session key) and what its answer pins (the DP rank)."""

    async def test_the_session_is_the_header_else_the_user_field(self, bundle):
        router = FakeRouter([1])
        d = deps(bundle, router, FakeDispatcher(lambda r: [done(r.request_id)]))
        await run(d, chat_body(user="alice"), session_id="conversation-7")
        await run(d, chat_body(user="alice"))
        await run(d, chat_body())
        await run(d, b'{"model": "m", "prompt": "hi", "max_tokens": 2}', COMPLETIONS, "c-1")
        assert [r.session_id for r in router.requests] == ["conversation-7", "alice", None, "c-1"]

    async def test_the_routed_rank_pins_each_attempt(self, bundle):
        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, 7), failed(req.request_id, 1, errors.CANNOT_CONNECT)]
            return [tokens(req.request_id, 8), done(req.request_id)]

        router, dispatcher = FakeRouter([1, 2], dp_ranks={1: 3}), FakeDispatcher(script)
        status, _ = await run(deps(bundle, router, dispatcher), chat_body(user="u"))
        assert status == 200
        assert [(r.instance_id, r.data_parallel_rank) for r in dispatcher.requests] == [
            (1, 3),
            (2, None),  # the migration's route: instance 2 has no rank pinned
        ]
        assert [r.session_id for r in router.requests] == ["u", "u"]


class TestMigration:
    async def test_resends_prompt_plus_generated_with_reduced_budget(self, bundle):
        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, 7), failed(req.request_id, 1, errors.CANNOT_CONNECT)]
            return [tokens(req.request_id, 8, 9), done(req.request_id)]

        router, dispatcher = FakeRouter([1, 2]), FakeDispatcher(script)
        d = deps(bundle, router, dispatcher)
        _, http = await run(
            d,
            chat_body(
                stream=True, max_tokens=5, min_tokens=2, stream_options={"include_usage": True}
            ),
        )
        first, retry = dispatcher.requests
        assert retry.token_ids == first.token_ids + [7]
        assert (retry.sampling.max_tokens, retry.sampling.min_tokens) == (4, 1)
        assert retry.request_id == first.request_id + ".m1"
        assert router.excluded == [[], [1]]
        assert http.events()[-2]["usage"]["completion_tokens"] == 3
        assert d.metrics.migrations.labels(MODEL, errors.CANNOT_CONNECT)._value.get() == 1

    async def test_dispatcher_loss_does_not_exclude_the_engine(self, bundle):
        calls = []

        def script(req):
            calls.append(req.instance_id)
            if len(calls) == 1:
                return [failed(req.request_id, 1, errors.DISCONNECTED, engine_fault=False)]
            return [tokens(req.request_id, 8), done(req.request_id)]

        router = FakeRouter([1])
        d = deps(bundle, router, FakeDispatcher(script))
        status, _ = await run(d, chat_body())
        assert status == 200 and calls == [1, 1] and router.excluded == [[], []]

    async def test_stale_replies_of_a_failed_attempt_are_ignored(self, bundle):
        def script(req):
            if req.instance_id == 1:
                # the failure, then a late token of the dead attempt in the same batch
                return [
                    failed(req.request_id, 1, errors.CANNOT_CONNECT),
                    tokens(req.request_id, 99),
                ]
            return [tokens(req.request_id, 8), done(req.request_id)]

        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(script))
        _, http = await run(d, chat_body(stream_options=None))
        assert http.json()["usage"]["completion_tokens"] == 1

    async def test_echo_prompt_logprobs_are_asked_until_they_came(self, bundle):
        """They come with an attempt's first reply: an attempt that failed before it leaves
        them to the next; after it, the next (prompt + output) must not ask again."""
        calls = []

        def script(req):
            calls.append(req.prompt_logprobs)
            if len(calls) == 1:
                return [failed(req.request_id, 1, errors.DISCONNECTED)]
            return [tokens(req.request_id, 8), done(req.request_id)]

        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(script))
        body = b'{"model": "m", "prompt": [5, 6], "max_tokens": 2, "echo": true, "logprobs": 0}'
        status, _ = await run(d, body, COMPLETIONS)
        assert status == 200 and calls == [0, 0]

    async def test_engines_that_refused_are_tried_again_when_none_is_left(self, bundle):
        """A refusal (an engine's own UNAVAILABLE to one call) avoids that engine while
        another is left; once every engine refused, they may take it again."""
        calls: list[int] = []

        def script(req):
            calls.append(req.instance_id)
            if len(calls) <= 2:
                return [failed(req.request_id, req.instance_id, errors.REFUSED)]
            return [tokens(req.request_id, 8), done(req.request_id)]

        router = FakeRouter([1, 2])
        d = deps(bundle, router, FakeDispatcher(script))
        status, _ = await run(d, chat_body())
        assert status == 200 and calls == [1, 2, 1]
        assert router.excluded == [[], [1], [1, 2], []]

    async def test_a_refusing_engine_stays_out_while_a_dead_one_is_excluded(self, bundle):
        calls: list[int] = []

        def script(req):
            calls.append(req.instance_id)
            if req.instance_id == 1:
                return [failed(req.request_id, 1, errors.CANNOT_CONNECT)]
            if len(calls) == 2:
                return [failed(req.request_id, 2, errors.REFUSED)]
            return [tokens(req.request_id, 8), done(req.request_id)]

        router = FakeRouter([1, 2])
        d = deps(bundle, router, FakeDispatcher(script))
        status, _ = await run(d, chat_body())
        # the dead engine stays excluded when the refusing one is tried again
        assert status == 200 and calls == [1, 2, 2]
        assert router.excluded == [[], [1], [1, 2], [1]]

    async def test_overloaded_engine_is_marked_busy(self, bundle):
        def script(req):
            if req.instance_id == 1:
                return [failed(req.request_id, 1, errors.OVERLOADED)]
            return [done(req.request_id)]

        router = FakeRouter([1, 2])
        d = deps(bundle, router, FakeDispatcher(script))
        status, _ = await run(d, chat_body())
        assert status == 200 and router.busy_log == [1]

    async def test_migration_limit(self, bundle):
        def script(req):
            return [
                failed(req.request_id, req.instance_id, errors.CANNOT_CONNECT, engine_fault=False)
            ]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script), migration_limit=2)
        status, http = await run(d, chat_body())
        assert status == 503
        assert "gave up after 2 migrations" in http.json()["error"]["message"]
        assert len(d.dispatcher.requests) == 3


JSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "p", "schema": {"type": "object"}},
}


class TestConstrainedMigration:
    """A grammar starts afresh with each engine request: a migrated constrained output is
    regenerated from the prompt, never continued (a second grammar's output after the first)."""

    @staticmethod
    def script(first: list[int], second: list[int], end_with_first=False):
        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, i) for i in first] + [
                    failed(req.request_id, 1, errors.DISCONNECTED)
                ]
            return (
                [tokens(req.request_id, *second[:2])]
                + [tokens(req.request_id, i) for i in second[2:]]
                + [done(req.request_id, "stop", cached=40)]
            )

        return script

    async def test_a_greedy_output_is_regenerated_and_only_the_new_part_sent(self, bundle):
        ids = ids_of(bundle, '{"name": "nova lumen", "age": 29}')
        dispatcher = FakeDispatcher(self.script(ids[:3], ids))
        d = deps(bundle, FakeRouter([1, 2]), dispatcher)
        body = chat_body(
            stream=True,
            temperature=0,
            max_tokens=50,
            response_format=JSON_FORMAT,
            stream_options={"include_usage": True},
        )
        status, http = await run(d, body)
        first, retry = dispatcher.requests
        assert retry.token_ids == first.token_ids  # the prompt alone, the grammar from its start
        assert retry.sampling.max_tokens == 50
        assert status == 200 and content(http) == '{"name": "nova lumen", "age": 29}'
        usage = http.events()[-2]["usage"]
        assert usage["completion_tokens"] == len(ids)
        # cached tokens are of the prompt the client sent, never more
        assert usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]

    async def test_logprobs_of_the_regenerated_part_are_not_sent_twice(self, bundle):
        ids = ids_of(bundle, '{"a": 1}')

        def lp(rid, chunk):
            from switchyard.protos.messages import DeltaDetail, TokenDelta, TokenLogprobs

            detail = DeltaDetail(0, TokenLogprobs([-0.5] * len(chunk), [], []))
            return TokenDelta(rid, list(chunk), detail)

        def script(req):
            if req.instance_id == 1:
                return [lp(req.request_id, ids[:2]), failed(req.request_id, 1, errors.DISCONNECTED)]
            return [lp(req.request_id, ids), done(req.request_id, "stop")]

        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(script))
        body = chat_body(temperature=0, logprobs=True, response_format=JSON_FORMAT)
        status, http = await run(d, body)
        choice = http.json()["choices"][0]
        assert status == 200 and choice["message"]["content"] == '{"a": 1}'
        assert len(choice["logprobs"]["content"]) == len(ids)

    async def test_other_regenerated_tokens_fail_the_request(self, bundle):
        ids = ids_of(bundle, '{"name": "nova lumen"}')
        other = ids_of(bundle, '{"age": 29}')
        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(self.script(ids[:3], other)))
        body = chat_body(stream=True, temperature=0, response_format=JSON_FORMAT)
        status, http = await run(d, body)
        events = http.events()
        assert status == 200 and events[-1] == "[DONE]"
        message = events[-2]["error"]["message"]
        assert "regenerating it on another engine gave other tokens" in message
        assert content(http) == bundle.decode(ids[:3])  # nothing of the other output

    async def test_an_early_end_of_the_regenerated_output_fails_the_request(self, bundle):
        ids = ids_of(bundle, '{"name": "nova lumen"}')
        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(self.script(ids[:4], ids[:2])))
        status, http = await run(d, chat_body(temperature=0, response_format=JSON_FORMAT))
        assert status == 503
        assert "gave other tokens" in http.json()["error"]["message"]

    async def test_a_sampled_output_the_client_has_parts_of_fails(self, bundle):
        ids = ids_of(bundle, '{"name": "nova lumen"}')
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, *ids[:3])])
        d = deps(bundle, FakeRouter([1, 2]), dispatcher)
        http = FakeHttp()
        body = chat_body(stream=True, temperature=0.7, response_format=JSON_FORMAT)
        serving = asyncio.create_task(serve(d, CHAT, body, http))
        while not http.writes:  # the client has the first tokens
            await asyncio.sleep(0.01)
        rid = dispatcher.requests[0].request_id
        dispatcher.streams[0].queue.put_nowait(failed(rid, 1, errors.DISCONNECTED))
        assert await serving == 200
        assert len(dispatcher.requests) == 1  # no second engine request that could not help
        assert "cannot be regenerated the same" in http.events()[-2]["error"]["message"]

    @pytest.mark.parametrize("stream", [False, True])
    async def test_a_sampled_output_the_client_has_none_of_starts_over(self, bundle, stream):
        """Not streamed (stop strings: the engine streams), or streamed but failed in the
        first batch: the request starts over from the prompt on another engine."""
        first = ids_of(bundle, '{"name": "nova')
        second = ids_of(bundle, '{"age": 29}')
        dispatcher = FakeDispatcher(self.script(first, second))
        d = deps(bundle, FakeRouter([1, 2]), dispatcher)
        body = chat_body(
            stream=stream,
            temperature=0.7,
            stop=["never"],
            response_format=JSON_FORMAT,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        status, http = await run(d, body)
        assert status == 200
        first_request, retry = dispatcher.requests
        assert retry.token_ids == first_request.token_ids and retry.instance_id == 2
        assert retry.request_id != first_request.request_id
        if stream:
            assert content(http) == '{"age": 29}'
            usage = http.events()[-2]["usage"]
        else:
            assert http.json()["choices"][0]["message"]["content"] == '{"age": 29}'
            usage = http.json()["usage"]
        assert usage["completion_tokens"] == len(second)
        assert d.metrics.migrations.labels(MODEL, errors.DISCONNECTED)._value.get() == 1

    async def test_starting_over_counts_towards_the_migration_limit(self, bundle):
        ids = ids_of(bundle, '{"name": "nova')

        def script(req):
            fault = failed(req.request_id, req.instance_id, errors.DISCONNECTED, False)
            return [tokens(req.request_id, *ids), fault]

        dispatcher = FakeDispatcher(script)
        d = deps(bundle, FakeRouter([1]), dispatcher, migration_limit=2)
        body = chat_body(temperature=0.7, stop=["never"], response_format=JSON_FORMAT)
        status, http = await run(d, body)
        assert status == 503 and len(dispatcher.requests) == 3
        assert "gave up after 2 migrations" in http.json()["error"]["message"]

    async def test_a_sampled_output_before_its_first_token_migrates(self, bundle):
        ids = ids_of(bundle, '{"a": 1}')
        d = deps(bundle, FakeRouter([1, 2]), FakeDispatcher(self.script([], ids)))
        body = chat_body(stream=True, temperature=0.7, response_format=JSON_FORMAT)
        status, http = await run(d, body)
        assert status == 200 and content(http) == '{"a": 1}'


class TestWatchdog:
    """Attempts that stream from the engine (whole_replies=False: --engine-streaming always)."""

    async def test_silent_before_the_first_token_migrates(self, bundle):
        def script(req):
            return (
                None if req.instance_id == 1 else [tokens(req.request_id, 8), done(req.request_id)]
            )

        d = deps(
            bundle,
            FakeRouter([1, 2]),
            FakeDispatcher(script),
            first_token_timeout=0.05,
            whole_replies=False,
        )
        status, _ = await run(d, chat_body())
        assert status == 200
        assert [r.instance_id for r in d.dispatcher.requests] == [1, 2]

    async def test_a_gap_between_tokens_migrates(self, bundle):
        """A frozen engine after its first tokens: the gap timeout, not the first-token one."""

        def script(req):
            if req.instance_id == 1:
                return [tokens(req.request_id, 7)]  # then nothing
            return [tokens(req.request_id, 8), done(req.request_id)]

        d = deps(
            bundle,
            FakeRouter([1, 2]),
            FakeDispatcher(script),
            first_token_timeout=60.0,
            gap_timeout=0.05,
            whole_replies=False,
        )
        status, http = await run(d, chat_body())
        assert status == 200 and http.json()["usage"]["completion_tokens"] == 2
        assert d.dispatcher.streams[0].cancelled

    async def test_a_long_first_token_wait_is_not_a_gap(self, bundle):
        """Before the first token only the first-token timeout applies."""

        async def late(stream):
            await asyncio.sleep(0.2)
            stream.queue.put_nowait(tokens(stream.request.request_id, 7))
            stream.queue.put_nowait(done(stream.request.request_id))

        dispatcher = FakeDispatcher(lambda r: None)
        d = deps(
            bundle,
            FakeRouter([1, 2]),
            dispatcher,
            first_token_timeout=5.0,
            gap_timeout=0.05,
            whole_replies=False,
        )
        serving = asyncio.create_task(run(d, chat_body()))
        while not dispatcher.streams:
            await asyncio.sleep(0.01)
        await late(dispatcher.streams[0])
        status, _ = await serving
        assert status == 200 and len(dispatcher.requests) == 1


class TestWholeReplies:
    """A request the client does not stream is asked of the engine whole (stream off), unless
    stop strings or a prefill hop need its tokens as they come."""

    @pytest.mark.parametrize(
        ("fields", "limits", "whole"),
        [
            ({}, {}, True),
            ({"stream": True}, {}, False),
            ({"stop": ["END"]}, {}, False),
            ({}, {"whole_replies": False}, False),
        ],
    )
    async def test_which_requests_go_whole(self, bundle, fields, limits, whole):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, 7), done(r.request_id)])
        d = deps(bundle, FakeRouter([1]), dispatcher, **limits)
        status, _ = await run(d, chat_body(**fields))
        assert status == 200
        assert dispatcher.requests[0].stream is not whole

    async def test_a_prefill_hop_streams(self, bundle):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, 7), done(r.request_id)])
        d = deps(bundle, FakeRouter([1], prefill=9), dispatcher)
        status, _ = await run(d, chat_body())
        assert status == 200
        assert len(dispatcher.requests) == 2  # the prefill and decode legs
        assert all(r.stream for r in dispatcher.requests)

    async def test_a_bug_in_a_prefill_hop_fails_the_request_and_is_counted(self, bundle):
        """Regression: the stage wired the hop's `on_internal_error(stage)` to a Counter's
        `inc`, which the stage name broke (TypeError): the hop's failure reply was never
        queued and the request waited for the first-token timeout."""

        class BrokenQueue:
            async def get(self):
                raise RuntimeError("bug")

        class Dispatcher(FakeDispatcher):
            async def open(self, request, queue=None):
                stream = await super().open(request, queue)
                if request.request_id.endswith(PREFILL_SUFFIX):
                    stream.queue = BrokenQueue()  # the prefill leg's reader trips
                return stream

        d = deps(bundle, FakeRouter([1], prefill=9), Dispatcher(lambda r: None))
        async with asyncio.timeout(10):  # far below the 60 s first-token timeout
            status, http = await run(d, chat_body())
        assert status == 500 and http.json()["error"]["code"] == "engine_error", http.json()
        counted = d.metrics.registry.get_sample_value(
            "switchyard_preprocessor_internal_errors_total", {"stage": "prefill_hop"}
        )
        assert counted == 1

    async def test_a_long_silent_whole_attempt_is_not_timed_out(self, bundle):
        """Silence is a whole attempt's normal state: it may take what a streamed attempt could
        at the longest, the first-token timeout + max_tokens (8) x the gap timeout (0.85 s)."""
        ids = ids_of(bundle, "a late answer")
        dispatcher = FakeDispatcher(lambda r: None)
        d = deps(bundle, FakeRouter([1, 2]), dispatcher, first_token_timeout=0.05, gap_timeout=0.1)
        serving = asyncio.create_task(run(d, chat_body()))
        while not dispatcher.streams:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        stream = dispatcher.streams[0]
        stream.queue.put_nowait(tokens(stream.request.request_id, *ids))
        stream.queue.put_nowait(done(stream.request.request_id))
        status, http = await serving
        assert status == 200 and len(dispatcher.requests) == 1
        assert http.json()["choices"][0]["message"]["content"] == "a late answer"

    async def test_a_whole_attempt_silent_past_its_longest_migrates(self, bundle):
        """An engine that stalls one whole request (serving the others) does not hold it
        forever: past first-token timeout + max_tokens x gap timeout it migrates."""

        def script(req):
            if req.instance_id == 1:
                return None  # stalled: never answers
            return [tokens(req.request_id, 8, 9), done(req.request_id)]

        dispatcher = FakeDispatcher(script)
        d = deps(bundle, FakeRouter([1, 2]), dispatcher, first_token_timeout=0.05, gap_timeout=0.01)
        status, http = await run(d, chat_body(max_tokens=5))
        assert status == 200 and http.json()["usage"]["completion_tokens"] == 2
        assert [r.instance_id for r in dispatcher.requests] == [1, 2]
        assert all(not r.stream for r in dispatcher.requests)  # both asked whole
        assert dispatcher.streams[0].cancelled  # the stalled one is aborted at its engine
        assert d.metrics.migrations.labels(MODEL, errors.DISCONNECTED)._value.get() == 1

    async def test_a_failed_whole_attempt_restarts_from_the_prompt(self, bundle):
        ids = ids_of(bundle, "the answer")

        def script(req):
            if req.instance_id == 1:
                return [failed(req.request_id, 1, errors.DISCONNECTED)]
            return [tokens(req.request_id, *ids), done(req.request_id)]

        dispatcher = FakeDispatcher(script)
        d = deps(bundle, FakeRouter([1, 2]), dispatcher)
        status, http = await run(d, chat_body())
        assert status == 200
        assert http.json()["choices"][0]["message"]["content"] == "the answer"
        first, second = dispatcher.requests
        assert second.token_ids == first.token_ids and not second.stream
        assert second.sampling.max_tokens == first.sampling.max_tokens


class TestFailures:
    async def test_failure_before_any_output_gets_its_status(self, bundle):
        d = deps(
            bundle,
            FakeRouter([1]),
            FakeDispatcher(lambda r: [failed(r.request_id, 1, errors.BAD_REQUEST)]),
        )
        status, http = await run(d, chat_body(stream=True))
        assert status == 400 and http.json()["error"]["code"] == "engine_rejected"

    async def test_failure_in_the_first_batch_still_gets_a_status(self, bundle):
        def script(req):
            return [tokens(req.request_id, 7, 8), failed(req.request_id, 1, errors.ENGINE_ERROR)]

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(script))
        status, http = await run(d, chat_body(stream=True))
        assert status == 500 and http.json()["error"]["code"] == "engine_error"

    async def test_failure_mid_stream_is_an_error_event(self, bundle):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, 7, 8)])
        d = deps(bundle, FakeRouter([1]), dispatcher)
        http = FakeHttp()
        serving = asyncio.create_task(serve(d, CHAT, chat_body(stream=True), http))
        while not http.writes:
            await asyncio.sleep(0.01)
        rid = dispatcher.requests[0].request_id
        dispatcher.streams[0].queue.put_nowait(failed(rid, 1, errors.ENGINE_ERROR))
        assert await serving == 200
        events = http.events()
        assert events[-2]["error"]["code"] == "engine_error" and events[-1] == "[DONE]"

    async def test_no_worker(self, bundle):
        d = deps(bundle, FakeRouter([]), FakeDispatcher(lambda r: []))
        status, http = await run(d, chat_body())
        assert status == 503

    async def test_unknown_model_and_bad_body(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: []))
        status, http = await run(d, chat_body(model="nope"))
        assert status == 404 and http.json()["error"]["code"] == "model_not_found"
        status, http = await run(d, b"{")
        assert status == 400 and http.json()["error"]["code"] == "invalid_json"

    async def test_cancelled_request_aborts_its_attempt(self, bundle):
        dispatcher = FakeDispatcher(lambda r: [tokens(r.request_id, 7)])
        d = deps(bundle, FakeRouter([1]), dispatcher)
        serving = asyncio.create_task(run(d, chat_body(stream=True)))
        while not dispatcher.streams:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        assert dispatcher.streams[0].cancelled


class TestPromptLimits:
    async def test_a_huge_prompt_is_refused_before_tokenizing(self, bundle):
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: []), context_length=1024)
        text = "word " * 2_000_000  # 10 MB
        misses = bundle.prompts.misses
        status, http = await run(d, chat_body(messages=[{"role": "user", "content": text}]))
        assert bundle.prompts.misses == misses  # no piece of it was tokenized
        assert status == 400
        error = http.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
        assert "at least" in error["message"]
        assert not d.dispatcher.requests

    async def test_a_long_prompt_is_refused_from_a_prefix(self, bundle):
        """Under the byte bound but far over the context: refused from a prefix's count."""
        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: []), context_length=1024)
        text = "x y " * 20_000  # 80 kB of one-character words: ~40k tokens
        status, http = await run(d, chat_body(messages=[{"role": "user", "content": text}]))
        assert status == 400
        assert http.json()["error"]["code"] == "context_length_exceeded"


class TestRelease:
    async def test_a_released_request_is_freed_without_a_garbage_collection(self, bundle):
        """Issue 13: a finished request's context and its generations pointed at each other,
        so every request's objects waited for a collection, and the young collections that
        walked them cost the preprocessor ~5% of its CPU (plus pauses)."""
        import gc

        from switchyard.preprocessor.stages.context import RequestContext
        from switchyard.preprocessor.stages.generation import Generation

        def alive() -> int:
            return sum(type(o) in (RequestContext, Generation) for o in gc.get_objects())

        d = deps(bundle, FakeRouter([1]), FakeDispatcher(lambda r: [done(r.request_id)]))
        http = FakeHttp()
        gc.collect()
        gc.disable()
        try:
            before = alive()
            ctx: RequestContext | None = endpoints.new_request(d, CHAT, http)
            assert ctx is not None
            assert await endpoints.serve(ctx, chat_body(stream=True)) == 200
            assert ctx.generations
            assert alive() == before + 2
            ctx.release()
            ctx = None
            assert alive() == before  # reference counting alone freed them
        finally:
            gc.enable()
