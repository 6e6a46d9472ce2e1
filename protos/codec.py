"""Encoders and decoders per channel: one decoder per union keeps decoding strict and fast."""

from __future__ import annotations

import msgspec

from switchyard.protos import messages as m

encoder = msgspec.msgpack.Encoder()
encode = encoder.encode

fleet_control_request = msgspec.msgpack.Decoder(m.FleetControlRequest)
fleet_control_reply = msgspec.msgpack.Decoder(m.FleetControlReply)
fleet_update = msgspec.msgpack.Decoder(m.FleetUpdate)
# A preprocessor sends what it has for the router in one loop iteration as one message: a
# single request, or a list of them (answered by a list of responses; see router/service).
router_request = msgspec.msgpack.Decoder(m.RouterRequest | list[m.RouterRequest])
route_response = msgspec.msgpack.Decoder(m.RouterReply | list[m.RouterReply])
# Likewise to a dispatcher (see common/messaging.DealerClient).
dispatcher_request = msgspec.msgpack.Decoder(m.DispatcherRequest | list[m.DispatcherRequest])
# The dispatcher batches its replies: each message is a list of them (see dispatcher/outbox).
dispatcher_replies = msgspec.msgpack.Decoder(list[m.DispatcherReply])
