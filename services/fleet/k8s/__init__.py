"""Kubernetes pod discovery for fleet: the pods that label selectors pick become workers.

Layout: `selector` (label selectors), `pods` (a pod to a WorkerSpec), `client` (the API over
kubernetes_asyncio), `watch` (list + watch per selector), `source` (the merged worker list);
`fake_api` is a test API server that speaks the real list/watch wire.
"""
