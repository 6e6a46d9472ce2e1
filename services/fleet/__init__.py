"""Fleet: owns the instance set (probes the engine URL list, publishes snapshots and diffs).

Layout: `source` (flags + watched workers file) and `k8s/` (Ready pods of label selectors) ->
`registry` (specs, probe results, down marks, roles) <- `prober` (cached engine clients);
`service` runs the ZMQ loops; `cli` wires it.
"""
