"""The request path: each endpoint's named stages over one context object (see endpoints).

Layout: context (contracts), endpoints (stage lists, serve), prompt, fanout, lifecycle (the
attempt state machine), migration (the policy), generation, token_loop (hot path), choice,
answer, sinks, responses, stored (the Responses API's kept state), embed, watchdog, timing,
logprobs.
"""
