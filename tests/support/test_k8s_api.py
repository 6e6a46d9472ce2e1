"""The test API server on the raw wire (plain HTTP, no client library): what it sends must be
what a real kube-apiserver sends, or the pod-watch tests prove nothing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from support.k8s_api import FakeKubeApi
from support.k8s_harness import ThreadedFakeKubeApi

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def server():
    api = FakeKubeApi(token="t")
    await api.start()
    async with aiohttp.ClientSession(api.url, headers={"Authorization": "Bearer t"}) as session:
        yield api, session
    await api.stop()


async def events(response, count):
    """The next `count` watch events, each one JSON document on its own line."""
    out = []
    while len(out) < count:
        line = await asyncio.wait_for(response.content.readline(), 10)
        assert line.endswith(b"\n"), f"not one event per line: {line!r}"
        out.append(json.loads(line))
    return out


class TestList:
    async def test_a_pod_list(self, server):
        api, session = server
        api.create_pod("a", labels={"app": "x"}, ports={"grpc": 1}, ready=True)
        api.create_pod("b", labels={"app": "y"})
        async with session.get(PODS, params={"labelSelector": "app=x"}) as reply:
            assert reply.status == 200 and reply.content_type == "application/json"
            body = await reply.json()
        assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
        assert body["metadata"] == {"resourceVersion": api.resource_version}
        (item,) = body["items"]
        assert "kind" not in item and "apiVersion" not in item  # list items carry neither
        assert item["metadata"]["name"] == "a" and item["metadata"]["uid"]
        assert item["status"]["podIP"] == "127.0.0.1"
        ready = {c["type"]: c["status"] for c in item["status"]["conditions"]}
        assert ready["Ready"] == "True"

    async def test_pages_come_from_one_snapshot(self, server):
        api, session = server
        for name in "abcde":
            api.create_pod(name)
        async with session.get(PODS, params={"limit": "2"}) as reply:
            first = await reply.json()
        api.delete_pod("e", graceful=False)  # after the first page: not in this list
        token = first["metadata"]["continue"]
        assert first["metadata"]["remainingItemCount"] == 3
        async with session.get(PODS, params={"limit": "2", "continue": token}) as reply:
            second = await reply.json()
        async with session.get(
            PODS, params={"limit": "2", "continue": second["metadata"]["continue"]}
        ) as reply:
            third = await reply.json()
        names = [p["metadata"]["name"] for page in (first, second, third) for p in page["items"]]
        assert names == list("abcde")
        assert "continue" not in third["metadata"]
        assert {page["metadata"]["resourceVersion"] for page in (first, second, third)} == {
            first["metadata"]["resourceVersion"]
        }

    async def test_an_expired_continue_token_is_410_with_a_status(self, server):
        api, session = server
        for name in "abc":
            api.create_pod(name)
        async with session.get(PODS, params={"limit": "1"}) as reply:
            token = (await reply.json())["metadata"]["continue"]
        api.compact()
        async with session.get(PODS, params={"limit": "1", "continue": token}) as reply:
            assert reply.status == 410
            status = await reply.json()
        assert (status["kind"], status["status"], status["reason"], status["code"]) == (
            "Status",
            "Failure",
            "Expired",
            410,
        )

    @pytest.mark.parametrize(
        "params, code, reason",
        [
            ({"labelSelector": "app in x"}, 400, "BadRequest"),
            ({"watch": "yes"}, 400, "BadRequest"),
            ({"fieldSelector": "status.phase=Running"}, 400, "BadRequest"),
            ({"resourceVersion": "999999", "resourceVersionMatch": "NotOlderThan"}, 504, "Timeout"),
        ],
    )
    async def test_errors_are_status_objects(self, server, params, code, reason):
        _, session = server
        async with session.get(PODS, params=params) as reply:
            assert reply.status == code
            status = await reply.json()
        assert status["kind"] == "Status" and status["code"] == code and status["reason"] == reason

    async def test_a_bearer_token_is_required(self, server):
        api, _ = server
        async with aiohttp.ClientSession() as anonymous:
            async with anonymous.get(api.url + PODS) as reply:
                assert reply.status == 401
                assert (await reply.json())["reason"] == "Unauthorized"


class TestWatch:
    async def test_chunked_stream_of_typed_events(self, server):
        api, session = server
        api.create_pod("a", labels={"app": "x"})
        version = api.resource_version
        params = {"watch": "true", "resourceVersion": version, "labelSelector": "app=x"}
        async with session.get(PODS, params=params) as reply:
            assert reply.status == 200
            assert reply.headers["Transfer-Encoding"] == "chunked"
            api.set_ready("a", True)
            api.delete_pod("a")
            got = await events(reply, 3)
        assert [e["type"] for e in got] == ["MODIFIED", "MODIFIED", "DELETED"]
        assert all(e["object"]["kind"] == "Pod" for e in got)  # watch objects carry kind
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
        assert versions == sorted(versions) and versions[0] > int(version)
        assert got[1]["object"]["metadata"]["deletionTimestamp"]

    async def test_without_a_version_the_current_state_comes_first(self, server):
        api, session = server
        api.create_pod("a")
        api.create_pod("b")
        async with session.get(PODS, params={"watch": "1"}) as reply:
            got = await events(reply, 2)
            api.create_pod("c")
            (later,) = await events(reply, 1)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
            ("ADDED", "a"),
            ("ADDED", "b"),
        ]
        assert (later["type"], later["object"]["metadata"]["name"]) == ("ADDED", "c")

    async def test_a_selector_turns_relabels_into_added_and_deleted(self, server):
        api, session = server
        api.create_pod("a", labels={"app": "x"})
        version = api.resource_version
        params = {"watch": "true", "resourceVersion": version, "labelSelector": "app=x"}
        async with session.get(PODS, params=params) as reply:
            api.update_pod("a", lambda p: p["metadata"]["labels"].update(app="y"))
            api.update_pod("a", lambda p: p["metadata"]["labels"].update(app="x"))
            got = await events(reply, 2)
        gone, back = got
        assert gone["type"] == "DELETED" and back["type"] == "ADDED"
        # The DELETED carries the last state the watcher could see, at the new version.
        assert gone["object"]["metadata"]["labels"] == {"app": "x"}
        assert int(gone["object"]["metadata"]["resourceVersion"]) < int(
            back["object"]["metadata"]["resourceVersion"]
        )

    async def test_bookmarks_only_when_asked_for(self, server):
        api, session = server
        version = api.resource_version
        plain = {"watch": "true", "resourceVersion": version}
        asked = {**plain, "allowWatchBookmarks": "true"}
        async with (
            session.get(PODS, params=plain) as without,
            session.get(PODS, params=asked) as with_bookmarks,
        ):
            api.send_bookmarks()
            api.create_pod("a")
            (bookmark, added) = await events(with_bookmarks, 2)
            (first,) = await events(without, 1)
        assert first["type"] == "ADDED"
        assert bookmark == {
            "type": "BOOKMARK",
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": version, "creationTimestamp": None},
                "spec": {"containers": None},
                "status": {},
            },
        }
        assert added["type"] == "ADDED"

    async def test_a_compacted_version_is_an_error_event_with_410(self, server):
        api, session = server
        old = api.resource_version
        api.create_pod("a")
        api.compact()
        async with session.get(PODS, params={"watch": "true", "resourceVersion": old}) as reply:
            assert reply.status == 200  # the watch cache answers, then sends the error
            (error,) = await events(reply, 1)
            assert await reply.content.read() == b""  # and ends the stream
        assert error["type"] == "ERROR"
        status = error["object"]
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
        assert status["message"].startswith(f"too old resource version: {old}")

    async def test_timeout_seconds_ends_the_stream_cleanly(self, server):
        api, session = server
        params = {"watch": "true", "resourceVersion": api.resource_version, "timeoutSeconds": "1"}
        async with session.get(PODS, params=params) as reply:
            assert await asyncio.wait_for(reply.content.read(), 10) == b""
        assert api.open_watches == 0

    async def test_a_broken_watch_is_a_truncated_chunked_body(self, server):
        api, session = server
        params = {"watch": "true", "resourceVersion": api.resource_version}
        async with session.get(PODS, params=params) as reply:
            api.create_pod("a")
            await events(reply, 1)
            api.break_watches()
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(reply.content.read(), 10)


def test_threaded_server_runs_calls_on_its_loop():
    server = ThreadedFakeKubeApi()
    try:
        url = server.call(server.api.start)
        server.call(server.api.create_pod, "a")
        assert url.startswith("http://127.0.0.1:")
        assert server.call(lambda: server.api.pod("a")["metadata"]["name"]) == "a"
        with pytest.raises(KeyError):
            server.call(server.api.set_ready, "missing", True)
    finally:
        server.close()
