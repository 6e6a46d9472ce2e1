"""The pod watch against a test API server that speaks the real list/watch wire, through the
real client library (kubernetes_asyncio, configured from a kubeconfig with a bearer token and
the CA of the server's TLS certificate, or as in a pod from a service account): pods appear,
become Ready, lose readiness, get deleted; the watch breaks and resumes; the history expires
(410 Gone, re-list); the API server is down for a while; bookmarks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

import pytest
import trustme
from support.k8s_api import FakeKubeApi
from support.k8s_harness import kubeconfig

from switchyard.fleet.k8s.client import PodApi
from switchyard.fleet.k8s.errors import ConfigError
from switchyard.fleet.k8s.source import PodSource
from switchyard.fleet.k8s.watch import PodWatch

TOKEN = "fleet-token"
ENGINE = {"app": "engine"}


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
async def kube(tmp_path, ca):
    """A running test API server (HTTPS, a certificate for 127.0.0.1 from `ca`) and a
    kubeconfig for it (context namespace `llm`)."""
    api = FakeKubeApi(token=TOKEN)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(tls)
    await api.start(ssl_context=tls)
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig(api.url, token=TOKEN, namespace="llm", ca_pem=ca.cert_pem.bytes()))
    try:
        yield api, str(path)
    finally:
        await api.stop()
        assert api.open_watches == 0


@contextlib.asynccontextmanager
async def watching(config, *selectors, **kwargs):
    kwargs.setdefault("backoff_base", 0.02)
    kwargs.setdefault("backoff_cap", 0.2)
    source = PodSource(selectors or ("app=engine",), kubeconfig=config, **kwargs)
    await source.start()
    try:
        yield source
    finally:
        await source.close()


def add(api, name, n, ready=True, labels=ENGINE, **kwargs):
    """Pod `name` with IP 127.0.1.n (loopback: nothing here connects to it)."""
    return api.create_pod(
        name,
        namespace="llm",
        labels=labels,
        ports={"grpc": 30000},
        ip=f"127.0.1.{n}",
        ready=ready,
        **kwargs,
    )


def urls(source):
    return [spec.url for spec in source.workers()]


def url(n):
    return f"grpc://127.0.1.{n}:30000"


def watch_requests(api):
    return [r for r in api.requests if r.watch]


class TestListAndWatch:
    async def test_the_instance_set_follows_each_step(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        add(api, "b", 2, ready=False)  # Pending, no IP yet
        async with watching(config) as source:
            await until(lambda: urls(source) == [url(1)], "the Ready pod listed")
            api.set_ready("b", True, namespace="llm")
            await until(lambda: urls(source) == [url(1), url(2)], "b Ready")
            add(api, "c", 3)
            await until(lambda: urls(source) == [url(1), url(2), url(3)], "c added")
            api.set_ready("a", False, namespace="llm")
            await until(lambda: urls(source) == [url(2), url(3)], "a unready")
            api.delete_pod("b", namespace="llm")  # terminating first, then gone
            await until(lambda: urls(source) == [url(3)], "b deleted")
            assert source.watches[0].lists == 1, "no re-list was needed"

    async def test_requests_follow_the_list_then_watch_protocol(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        listed_at = api.resource_version
        async with watching(config) as source:
            await until(lambda: watch_requests(api), "a watch")
            add(api, "b", 2)
            await until(lambda: len(urls(source)) == 2, "b")
        first, watch = api.requests[0], watch_requests(api)[0]
        assert first.path == "/api/v1/namespaces/llm/pods"  # the kubeconfig context's namespace
        assert not first.watch and first.query["labelSelector"] == "app=engine"
        assert int(first.query["limit"]) > 0 and "resourceVersion" not in first.query
        assert watch.query["resourceVersion"] == listed_at
        assert watch.query["labelSelector"] == "app=engine"
        assert watch.query["allowWatchBookmarks"] in ("true", "True")
        assert int(watch.query["timeoutSeconds"]) > 0

    async def test_a_pod_relabelled_out_of_the_selector_leaves(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        async with watching(config) as source:
            await until(lambda: urls(source) == [url(1)], "a")
            api.update_pod("a", lambda p: p["metadata"]["labels"].update(app="other"), "llm")
            await until(lambda: urls(source) == [], "a relabelled away")
            api.update_pod("a", lambda p: p["metadata"]["labels"].update(app="engine"), "llm")
            await until(lambda: urls(source) == [url(1)], "a relabelled back")

    async def test_a_watch_the_server_ends_is_renewed_from_the_same_version(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        async with watching(config, watch_timeout_s=1) as source:
            await until(lambda: len(watch_requests(api)) >= 2, "a second watch")
            add(api, "b", 2)
            await until(lambda: len(urls(source)) == 2, "b")
            assert source.watches[0].lists == 1
        versions = [int(r.query["resourceVersion"]) for r in watch_requests(api)]
        assert versions == sorted(versions) and versions[0] == 1001

    async def test_a_paged_list_is_read_to_the_end(self, kube, until):
        api, config = kube
        for n in range(7):
            add(api, f"p{n}", n + 1)
        client = await PodApi.connect(config)
        watch = PodWatch(client, "app=engine", lambda: None, page_size=3)
        try:
            await watch._list()
        finally:
            await client.close()
        assert len(watch.pods) == 7 and watch.resource_version == api.resource_version
        continues = [r.query.get("continue") for r in api.requests]
        assert continues[0] is None and all(continues[1:]) and len(continues) == 3


class TestBrokenStreams:
    async def test_a_cut_stream_resumes_from_the_last_event(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        async with watching(config) as source:
            await until(lambda: watch_requests(api), "watching")
            add(api, "b", 2)
            await until(lambda: len(urls(source)) == 2, "b")
            seen = api.resource_version
            api.break_watches()
            api.set_ready("a", False, namespace="llm")  # while no watch is open
            await until(lambda: urls(source) == [url(2)], "a unready, seen after the break")
            assert source.watches[0].lists == 1
        assert watch_requests(api)[-1].query["resourceVersion"] == seen

    @pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
    async def test_410_gone_relists_and_catches_up(self, kube, until, as_http):
        api, config = kube
        api.gone_as_http = as_http
        add(api, "a", 1)
        add(api, "b", 2)
        async with watching(config) as source:
            await until(lambda: len(urls(source)) == 2 and watch_requests(api), "a and b")
            api.break_watches()
            api.delete_pod("a", namespace="llm")
            add(api, "c", 3)
            api.compact()  # the deletion of a is no longer in the history
            await until(lambda: source.watches[0].lists == 2, "a re-list")
            await until(lambda: urls(source) == [url(2), url(3)], "the state after the gap")
            add(api, "d", 4)
            await until(lambda: len(urls(source)) == 3, "d, watched after the re-list")

    async def test_an_expired_continue_token_restarts_the_list(self, kube):
        api, config = kube
        for n in range(5):
            add(api, f"p{n}", n + 1)
        client = await PodApi.connect(config)

        class CompactingAfterFirstPage:
            """The API's history expires between two pages of one list."""

            where, namespace, pages = client.where, client.namespace, 0

            async def list_pods(self, selector, limit, token):
                self.pages += 1
                page = await client.list_pods(selector, limit, token)
                if self.pages == 1:
                    api.delete_pod("p0", namespace="llm", graceful=False)
                    api.compact()
                return page

            def watch_pods(self, *args):
                return client.watch_pods(*args)

        lister = CompactingAfterFirstPage()
        changes = []
        watch = PodWatch(lister, "app=engine", lambda: changes.append(1), page_size=2)
        watch._backoff.base = watch._backoff.cap = 0.01
        try:
            run = asyncio.create_task(watch.run())
            while not watch.synced:
                await asyncio.sleep(0.01)
            run.cancel()
        finally:
            await client.close()
        # The first list died with 410 on its second page; the restarted one is consistent.
        assert sorted(p["metadata"]["name"] for p in watch.pods.values()) == [
            "p1",
            "p2",
            "p3",
            "p4",
        ]
        assert watch.lists == 1 and changes == [1]


class TestBookmarks:
    async def test_bookmarks_carry_the_version_past_unrelated_writes(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        async with watching(config) as source:
            await until(lambda: watch_requests(api), "watching")
            for n in range(5):  # writes this selector does not see
                add(api, f"other-{n}", 10 + n, labels={"app": "other"})
            api.send_bookmarks()
            current = api.resource_version
            await until(lambda: source.watches[0].resource_version == current, "the bookmark")
            api.compact()
            api.break_watches()
            add(api, "b", 2)
            await until(lambda: len(urls(source)) == 2, "b")
            assert source.watches[0].lists == 1, "resuming from the bookmark needs no re-list"
        assert watch_requests(api)[-1].query["resourceVersion"] == current

    async def test_without_a_bookmark_the_same_gap_costs_a_relist(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        async with watching(config) as source:
            await until(lambda: watch_requests(api), "watching")
            for n in range(5):
                add(api, f"other-{n}", 10 + n, labels={"app": "other"})
            api.compact()
            api.break_watches()
            add(api, "b", 2)
            await until(lambda: len(urls(source)) == 2, "b")
            assert source.watches[0].lists == 2


class TestOutages:
    async def test_api_server_down_keeps_the_last_pods_then_resumes(self, kube, until):
        api, config = kube
        add(api, "a", 1)
        async with watching(config) as source:
            await until(lambda: urls(source) == [url(1)] and watch_requests(api), "a")
            await api.stop()
            add(api, "b", 2)  # changes while nobody can see them
            api.set_ready("a", False, namespace="llm")
            watch = source.watches[0]
            await until(lambda: watch._backoff.failures >= 3, "several refused attempts")
            assert urls(source) == [url(1)], "the last known pods stay in force"
            await api.start()
            await until(lambda: urls(source) == [url(2)], "the changes made during the outage")
            assert watch.lists == 1, "the history outlived the outage: the watch resumed"

    async def test_server_errors_are_retried_with_backoff(self, kube, until, caplog):
        api, config = kube
        add(api, "a", 1)
        api.fail_next(3, 500)
        async with watching(config) as source:
            await until(lambda: urls(source) == [url(1)], "a, after three 500s")
            assert source.watches[0].lists == 1
        assert len(api.requests) >= 4  # 3 failures, then the list
        messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("500 InternalError" in m for m in messages) == 1, "logged once"

    async def test_forbidden_is_an_error_for_the_operator(self, kube, until, caplog):
        api, config = kube
        add(api, "a", 1)
        api.fail_next(2, 403, "Forbidden")
        async with watching(config) as source:
            await until(lambda: urls(source) == [url(1)], "a, once RBAC allows it")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("403 Forbidden" in m and "cannot list" in m for m in errors)

    async def test_a_wrong_token_never_lists(self, kube, ca, tmp_path, until, caplog):
        api, _ = kube
        add(api, "a", 1)
        config = tmp_path / "wrong"
        ca_pem = ca.cert_pem.bytes()
        config.write_text(kubeconfig(api.url, token="not-it", namespace="llm", ca_pem=ca_pem))
        async with watching(str(config)) as source:
            await until(lambda: len(api.requests) >= 3, "retries")
            assert not source.synced and urls(source) == []
        assert any("401 Unauthorized" in r.getMessage() for r in caplog.records)


class TestSelectors:
    async def test_prefill_and_decode_pools_are_one_worker_list(self, kube, until):
        api, config = kube
        add(api, "p", 1, labels={"pool": "prefill", "switchyard.ai/role": "prefill"})
        add(api, "d", 2, labels={"pool": "decode"})
        add(api, "x", 3, labels={"pool": "other"})
        async with watching(config, "pool=prefill", "pool=decode") as source:
            await until(lambda: urls(source) == [url(1), url(2)], "both pools")
            specs = {spec.url: spec for spec in source.workers()}
            assert specs[url(1)].prefill and not specs[url(2)].prefill
            add(api, "d2", 4, labels={"pool": "decode"})
            await until(lambda: len(urls(source)) == 3, "a second decode pod")
        selectors = {r.query["labelSelector"] for r in watch_requests(api)}
        assert selectors == {"pool=prefill", "pool=decode"}

    async def test_a_pod_both_selectors_pick_is_one_worker(self, kube, until):
        api, config = kube
        add(api, "a", 1, labels={"app": "engine", "pool": "decode"})
        async with watching(config, "app=engine", "pool=decode") as source:
            await until(lambda: source.synced and urls(source) == [url(1)], "one worker")


class TestProblems:
    async def test_a_misconfigured_ready_pod_is_left_out_and_logged_once(self, kube, until, caplog):
        api, config = kube
        api.create_pod("odd", namespace="llm", labels=ENGINE, ports={"http": 8080}, ready=True)
        add(api, "a", 1)
        async with watching(config) as source:
            await until(lambda: urls(source) == [url(1)], "a")
            add(api, "b", 2)
            await until(lambda: len(urls(source)) == 2, "b")
        warnings = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        problem = "no container port named 'grpc' (--k8s-grpc-port)"
        assert warnings == [f"pod llm/odd left out: {problem}"]


class TestConfiguration:
    async def test_in_a_pod_the_service_account_is_used(
        self, kube, ca, tmp_path, monkeypatch, until
    ):
        api, _ = kube
        add(api, "a", 1)
        account = tmp_path / "serviceaccount"
        account.mkdir()
        (account / "token").write_text(TOKEN)
        (account / "ca.crt").write_bytes(ca.cert_pem.bytes())
        (account / "namespace").write_text("llm")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        source = PodSource(["app=engine"], service_account=account, backoff_base=0.02)
        await source.start()
        try:
            await until(lambda: urls(source) == [url(1)], "a, listed with the pod's token")
        finally:
            await source.close()
        assert {r.path for r in api.requests} == {"/api/v1/namespaces/llm/pods"}

    async def test_a_server_certificate_from_another_ca_is_refused(
        self, kube, tmp_path, until, caplog
    ):
        api, _ = kube
        add(api, "a", 1)
        config = tmp_path / "other-ca"
        other = trustme.CA().cert_pem.bytes()
        config.write_text(kubeconfig(api.url, token=TOKEN, namespace="llm", ca_pem=other))
        async with watching(str(config)) as source:
            await until(
                lambda: "CERTIFICATE_VERIFY_FAILED" in caplog.text, "the verification failure"
            )
            assert not source.synced and api.requests == []

    async def test_no_kubeconfig_fails_at_start(self, tmp_path, monkeypatch):
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        source = PodSource(["app=engine"], kubeconfig=str(tmp_path / "missing"))
        with pytest.raises(ConfigError, match="no kubeconfig"):
            await source.start()
        await source.close()

    async def test_explicit_namespace_wins(self, kube, until):
        api, config = kube
        api.create_pod("a", namespace="other", labels=ENGINE, ports={"grpc": 1}, ready=True)
        async with watching(config, namespace="other") as source:
            await until(lambda: len(urls(source)) == 1, "the pod of namespace other")
        assert {r.path for r in api.requests} == {"/api/v1/namespaces/other/pods"}

    def test_selectors_are_checked_up_front(self):
        with pytest.raises(ValueError, match="selector"):
            PodSource(["app in engine"])
