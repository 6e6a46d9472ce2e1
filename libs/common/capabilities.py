"""Request fields only some engine protocols can carry, per protocol.

A request that needs one (today: `seed`) is routed to the engines that can honour it
(router filter `capable`), migrates among them, and is refused with a 400 naming the field
only when no engine of its model can. The engine adapters refuse the field too (a request
that reached the wrong engine anyway is a bad_request, never a silent drop).

Where the engines' gRPC APIs (smg-grpc-proto) differ, and why only `seed` is here:

    seed                  vLLM SamplingParams.seed; SGLang's SamplingParams has none  -> here
    json_object, choice   vLLM has them as such; SGLang as an equivalent JSON schema /
                          regex alternation (the adapter maps them)
    prompt logprobs       vLLM counts them apart from output logprobs; SGLang one
                          top_logprobs_num for both (the adapter asks the larger, cuts each)
    stop strings, include_stop_str_in_output, no_stop_trim, truncate_prompt_tokens
                          matched / cut by the frontend for both (SGLang runs tokenizer-less)
    return_hidden_states, token_ids_logprob, lora_id, custom_logit_processor (SGLang),
    logprobs -1 "all" (vLLM)
                          no OpenAI request field asks for them here (unknown fields are 400s)
"""

from __future__ import annotations

from collections.abc import Iterable

from switchyard.protos.messages import PROTOCOL_SGLANG, PROTOCOL_VLLM

SEED = "seed"

BY_PROTOCOL: dict[str, frozenset[str]] = {
    PROTOCOL_VLLM: frozenset({SEED}),
    PROTOCOL_SGLANG: frozenset(),
}


def of(protocol: str) -> frozenset[str]:
    """What an engine of this protocol can honour (nothing for an unknown protocol)."""
    return BY_PROTOCOL.get(protocol, frozenset())


def can_honour(protocol: str, needs: Iterable[str]) -> bool:
    return of(protocol).issuperset(needs)
