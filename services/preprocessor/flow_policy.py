"""Who a request is to flow control, and what it asks for (the `admit` stage's inputs).

- Flow: the tenant header's value (the file's `tenant_header`, set by a trusted proxy),
  else the API key's flow (`keys`; an unmapped key is a flow of its own, `key:<12 hex of
  its SHA-256>`), else `default`.
- Priority (lower is served first, as vLLM's `priority`): the body's `priority`, else the
  `x-priority` header (a number or a class name), else the flow's `priority`, else the
  file's `default_priority`. One more urgent than the flow's `min_priority` is a 400.
- TTFT objective: the `x-ttft-objective-ms` header, else the flow's `ttft_objective_ms`.

Without a flow config none of these can take effect: a nonzero `priority` or either header
is then a 400 naming it, never accepted and dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from switchyard.common.flow.config import (
    DEFAULT_FLOW,
    KEY_FLOW_PREFIX,
    OBJECTIVE_HEADER,
    PRIORITY_HEADER,
    FlowConfig,
    valid_flow_name,
)
from switchyard.preprocessor.errors import INVALID_VALUE, UNSUPPORTED_VALUE, InvalidRequestError

_PRIORITY = PRIORITY_HEADER.decode()
_OBJECTIVE = OBJECTIVE_HEADER.decode()


@dataclass(frozen=True, slots=True)
class FlowRequest:
    flow: str
    priority: int
    objective_ms: float  # 0: none


def resolve(
    config: FlowConfig | None,
    key: str,
    headers: Iterable[tuple[bytes, bytes]],
    body_priority: int | None,
) -> FlowRequest | None:
    """The request's flow, priority and objective; None without flow control (after
    refusing what would then be dropped). InvalidRequestError for a bad value. `key`: the
    SHA-256 of the client's API key in hex ("" : no keys)."""
    tenant = priority_text = objective_text = None
    tenant_header = config.tenant_header if config is not None else None
    for name, value in headers:
        if name == PRIORITY_HEADER:
            priority_text = value
        elif name == OBJECTIVE_HEADER:
            objective_text = value
        elif name == tenant_header and value:
            tenant = value
    if config is None:
        if body_priority:
            raise InvalidRequestError(
                "'priority' takes effect only with flow control (--flow-config); send 0 or "
                "leave it out.",
                UNSUPPORTED_VALUE,
                "priority",
            )
        for header, text in ((_PRIORITY, priority_text), (_OBJECTIVE, objective_text)):
            if text is not None:
                raise InvalidRequestError(
                    f"The {header} header takes effect only with flow control (--flow-config).",
                    UNSUPPORTED_VALUE,
                    header,
                )
        return None
    if tenant is not None:
        flow = tenant.decode("latin-1")
        if not valid_flow_name(flow):
            header = tenant_header.decode() if tenant_header else ""
            raise InvalidRequestError(
                f"The {header} header must be 1 to 64 letters, digits and '._:@/+=~-'.",
                INVALID_VALUE,
                header,
            )
    elif key:
        flow = config.keys.get(key) or KEY_FLOW_PREFIX + key[:12]
    else:
        flow = DEFAULT_FLOW
    spec = config.spec(flow)
    where = "priority"
    if body_priority is not None:
        priority = body_priority
    elif priority_text is not None:
        where = _PRIORITY
        try:
            priority = config.priority_value(priority_text.decode("latin-1").strip(), where)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), INVALID_VALUE, where) from None
    elif spec.priority is not None:
        priority = spec.priority
    else:
        priority = config.default_priority
    if spec.min_priority is not None and priority < spec.min_priority:
        raise InvalidRequestError(
            f"{where} {priority} is more urgent than this flow may ask for (at most "
            f"{spec.min_priority}; lower is more urgent).",
            INVALID_VALUE,
            where,
        )
    objective = spec.ttft_objective_ms or 0.0
    if objective_text is not None:
        try:
            objective = float(objective_text)
        except ValueError:
            objective = -1.0
        if not 0 < objective < math.inf:
            raise InvalidRequestError(
                f"The {_OBJECTIVE} header must be a positive number of milliseconds.",
                INVALID_VALUE,
                _OBJECTIVE,
            )
    return FlowRequest(flow, priority, objective)
