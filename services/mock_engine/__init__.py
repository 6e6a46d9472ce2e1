"""Mock engine: a CPU stand-in for stock SGLang / vLLM engines serving their real gRPC APIs.

Layout: config, errors, types, tokens, generation (the neutral core); tokenizer_facts, deps,
tokenizer_bundle, sglang_servicer, vllm_servicer (adapters); server, cli, __main__, testing.
"""
