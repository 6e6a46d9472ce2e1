"""Stored responses across processes and restarts, and a database that fails (issue 36):
a SQLite stack restarted keeps its responses; with PostgreSQL a chain started on one
preprocessor continues on another; a database that is down or frozen fails requests that
would be stored with a 503 at once (never a hang), or serves them unstored with a warning
header under --store-unavailable serve, and both recover when it is back.
"""

from __future__ import annotations

import time

import openai
import pytest
from e2e_stack import Processes, running_stack
from support.postgres import PostgresMissing, throwaway_postgres

KEY = "sk-replicas-e2e"
MODEL = "deepseek-mock"


def ask(client: openai.OpenAI, **kw):
    return client.responses.create(model=MODEL, max_output_tokens=6, temperature=0, **kw)


def client_for(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key=KEY, max_retries=0, timeout=60)


class TestSqliteRestart:
    def test_a_restarted_stack_keeps_its_responses(self, tmp_path):
        args = ("--mock-engines", "sglang", "--data-dir", str(tmp_path), "--api-key", KEY)
        with running_stack(*args) as s:
            with client_for(s.base_url) as client:
                first = ask(client, input="remember this")
                conv = client.conversations.create(
                    items=[{"type": "message", "role": "user", "content": "hello"}]
                )
        with running_stack(*args) as s:
            with client_for(s.base_url) as client:
                assert client.responses.retrieve(first.id).output_text == first.output_text
                second = ask(client, input="and now?", previous_response_id=first.id)
                items = list(client.responses.input_items.list(second.id, order="asc"))
                assert [i.role for i in items] == ["user", "assistant", "user"]
                assert len(list(client.conversations.items.list(conv.id))) == 1


@pytest.fixture(scope="module")
def postgres():
    try:
        with throwaway_postgres() as server:
            yield server
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def replicas(postgres):
    """A stack on PostgreSQL (preprocessor A: --store-unavailable fail) and a second
    preprocessor B on the same router, dispatcher, fleet and database (serve)."""
    up = ("--mock-engines", "vllm", "--postgres-dsn", postgres.dsn, "--api-key", KEY)
    with running_stack(*up, "--store-timeout", "1") as s, Processes() as procs:
        children = s.report()["children"]
        b = procs.serve(
            "preprocessor-b",
            "preprocessor", "--host", "127.0.0.1", "--port", "0",
            "--fleet-control", children["fleet"]["control"],
            "--fleet-events", children["fleet"]["events"],
            "--router", children["router-0"]["bind"],
            "--dispatcher", children["dispatcher-0"]["bind"],
            "--postgres-dsn", postgres.dsn, "--api-key", KEY,
            "--store-timeout", "1", "--store-unavailable", "serve",
        )  # fmt: skip
        clients = (client_for(s.base_url), client_for(f"http://127.0.0.1:{b['port']}"))
        deadline = time.monotonic() + 120
        while True:  # B serves once it has the model's tokenizer
            try:
                ask(clients[1], input="warm up", store=False)
                break
            except (openai.APIStatusError, openai.APIConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        try:
            yield clients
        finally:
            for client in clients:
                client.close()


class TestPostgres:
    def test_a_chain_continues_on_another_preprocessor(self, replicas):
        a, b = replicas
        first = ask(a, input="started on A")
        second = ask(b, input="continued on B", previous_response_id=first.id)
        third = ask(a, input="back on A", previous_response_id=second.id)
        items = list(a.responses.input_items.list(third.id, order="asc"))
        assert [i.role for i in items] == ["user", "assistant"] * 2 + ["user"]
        assert b.responses.retrieve(third.id).id == third.id
        conv = b.conversations.create()
        ask(a, input="turn 1", conversation=conv.id)
        ask(b, input="turn 2", conversation=conv.id)
        assert len(list(a.conversations.items.list(conv.id))) == 4

    def test_a_frozen_database_fails_fast_or_serves_unstored(self, replicas, postgres):
        a, b = replicas
        kept = ask(a, input="before the freeze")
        postgres.pause()
        try:
            self.check_unavailable(a, b, kept.id)
        finally:
            postgres.resume()
        self.check_recovered(a, kept.id)

    def test_a_stopped_database_fails_fast_or_serves_unstored(self, replicas, postgres):
        a, b = replicas
        kept = ask(a, input="before the stop")
        postgres.stop()
        try:
            self.check_unavailable(a, b, kept.id)
        finally:
            postgres.start()
        self.check_recovered(a, kept.id)

    @staticmethod
    def check_unavailable(a: openai.OpenAI, b: openai.OpenAI, kept: str) -> None:
        for _ in range(2):  # the first notices (within --store-timeout), the next fails at once
            with pytest.raises(openai.InternalServerError) as err:
                ask(a, input="to be stored")
            assert err.value.status_code == 503
            assert err.value.body["code"] == "store_unavailable"
        assert ask(a, input="not stored", store=False).store is False
        with pytest.raises(openai.InternalServerError):
            ask(a, input="needs a read", previous_response_id=kept)
        raw = b.responses.with_raw_response.create(
            model=MODEL, input="served anyway", max_output_tokens=4
        )
        served = raw.parse()
        assert raw.status_code == 200 and served.store is False
        assert "not kept" in raw.headers["x-switchyard-warning"]
        with pytest.raises(openai.InternalServerError):  # reads cannot be served around it
            b.responses.retrieve(kept)

    @staticmethod
    def check_recovered(a: openai.OpenAI, kept: str) -> None:
        deadline = time.monotonic() + 60
        while True:  # a probe a second finds it back
            try:
                reply = ask(a, input="after", previous_response_id=kept)
                break
            except openai.InternalServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert a.responses.retrieve(reply.id).previous_response_id == kept

