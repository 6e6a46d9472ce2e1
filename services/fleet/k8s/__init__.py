"""Kubernetes pod discovery for fleet: the pods that label selectors pick become workers.

Layout: `selector` (label selectors), `pods` (a pod to a WorkerSpec), `types` and `errors`
(the contract), `client` (the API over kubernetes_asyncio, loaded only when used), `watch`
(list + watch per selector), `source` (the merged worker list), `cli` (the --k8s flags).
The test API server that speaks the real wire is tests/support/k8s_api.py.
"""
