"""router: answers "which worker for this request?" over ZMQ.

Layout: `types` (contracts: WorkerView, RouteContext, Policy), `load` (in-flight bookkeeping),
`policies/` (one file per policy), `core` (candidate filtering + policy), `service` (ZMQ), `cli`.
"""
