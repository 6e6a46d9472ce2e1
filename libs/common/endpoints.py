"""Default ZMQ endpoints of the local stack. Every service takes them as flags; these are the
values `switchyard up` and a single-host deployment use."""

FLEET_CONTROL = "tcp://127.0.0.1:7100"
FLEET_EVENTS = "tcp://127.0.0.1:7101"
ROUTER = "tcp://127.0.0.1:7200"
DISPATCHER = "tcp://127.0.0.1:7300"
HTTP_HOST = "127.0.0.1"
HTTP_PORT = 8000
