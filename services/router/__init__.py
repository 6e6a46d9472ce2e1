"""router: answers "which worker for this request?" over ZMQ.

Layout: `types` (contracts: Worker, RouteContext, Filter/Scorer/Picker), `config` (frozen
routing config, presets), `framework` (filters -> weighted scorers -> picker), `policies/` (one
file per plugin, the registry), `disagg` (prefill/decode: profile handler, deciders),
`timing` (the time model), `prefix`, `bookings`, `load`,
`load_poller`, `prompt_hashes`, `kv/` (KV events and the index), `core` (a decision), `service`
(ZMQ), `cli`.
"""
