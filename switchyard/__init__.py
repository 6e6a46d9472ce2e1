"""Switchyard: an OpenAI-compatible frontend that routes straight to stock SGLang and vLLM
engines over their native gRPC APIs.

Layout: `cli` (the `switchyard` command: one subcommand per service, plus `up`),
`supervisor` (starts, watches and stops child processes), `stack` (the local stack `up` runs).
The services live in services/, shared code in libs/common, messages in protos/.
"""
