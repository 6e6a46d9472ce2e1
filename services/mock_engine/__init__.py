"""Mock engine: a CPU stand-in for stock SGLang / vLLM engines serving their real gRPC APIs,
with a simulated prefix cache, simulated timing and the engines' own KV event wire.

Layout: config, errors, types, timing, tokens, distribution, kv_cache, kv_events, faults,
kv_handover, generation, data_parallel, samples, patterns, grammars, json_instances, structured,
script, embedding (the neutral core); tokenizer_facts, deps, tokenizer_bundle, kv_wire, kv_zmq,
kv_grpc, kv_transfer, disagg, logprob_messages, common_rpcs, sglang_servicer, vllm_servicer
(adapters); server, cli, __main__. Helpers for tests that run one: tests/support/mock_engine.py;
what a gateway sees of one, for the parity test with a real vLLM: tests/support/wire_shapes.py.
"""
