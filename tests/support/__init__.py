"""Test support shared by the unit tests beside each package and the end-to-end tests here
(pytest puts tests/ on sys.path: `pythonpath` in pyproject.toml). Not shipped.

Layout: `mock_engine` (a mock engine in process or as a subprocess, KV-event sockets, polling
waits, tokenizer folders with a template), `parsers` (feeding output parsers chunk by chunk),
`k8s_api` (a Kubernetes API server for pods that speaks the real list/watch wire; `k8s_wire`
its JSON and Status bodies, `k8s_harness` it in a thread and kubeconfigs for it), `postgres`
(a throwaway PostgreSQL server from Debian's binaries), `loopback` (127.0.0.2-4 as the
replicas of one name, a port free on each).
"""
