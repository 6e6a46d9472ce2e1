"""dispatcher: holds the gRPC channels to the engines and runs generations for the pipeline.

Layout: `channels` (one EngineClient per instance, opened on Added, closed on Removed),
`streams` (one generation: engine stream -> neutral replies, abort on cancel), `embeds` (one
embed request: an Embed call per input, one reply), `stall` (an engine silent on every
stream), `service` (ZMQ), `cli`.
"""
