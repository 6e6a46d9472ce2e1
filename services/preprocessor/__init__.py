"""The preprocessor: OpenAI HTTP ingress, chat template, tokenization, the request stages.

Layout: edge (generation endpoints as ASGI) and app (the other routes); openai_schema and
openai_requests (body -> request types), responses_schema and responses_requests (the Responses
API's); stages/ (the request path, see its docstring); chat_template, tokenizer, prompt_encoder
and pretokens (prompt ids), detokenizer, stop_strings, sse (response bytes); router_client,
dispatcher_client, reply_queue, prefill_hop; parsers/ (tool calls, reasoning); request_ids
(X-Request-Id), access_log (one line per request), tracing (OpenTelemetry, imported only when
on); storage/ (the response store), stored_responses and conversations (their routes),
stored_items and object_pages (their items and list pages); state, catalog, metrics, cli.
"""
