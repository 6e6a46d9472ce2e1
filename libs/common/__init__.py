"""What every service shares.

Layout: instance_id, errors, instance_diff, workers, candidates (which engines may take a
request: the router's rules, the preprocessor's fallback), capabilities (request fields only
some engine protocols carry), block_hash (_blockhash.c: its optional C form), engines/ (the
engine gRPC adapters), messaging, replicas (every replica behind a service's name),
fleet_client, ports, endpoints, runner, healthcheck; settings (flags, SWITCHYARD_<FLAG>, the
--config file), argtypes (count and seconds flags), logs (--log-format), metrics,
loop_histogram; heap (the start-up heap, frozen); scratch (per-process temporary folders);
native (which C extensions run: SWITCHYARD_NATIVE=0 turns them off); fuzz/ (libFuzzer
harnesses of the C that reads network bytes).
"""
