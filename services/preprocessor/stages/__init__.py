"""The request path as named stages over one context object.

Layout: context (input, deps, state), endpoints (the stage list per endpoint and `serve`),
prompt (model, template, tokenize, check), generation (route, prefill hop, dispatch,
migration), token_loop (the per-token loop), choice (one choice's text path), sinks (SSE or
JSON out), responses (the Responses API's object, events and sinks), embed (embeddings),
watchdog (silent attempts), timing (--stage-timing).
"""
