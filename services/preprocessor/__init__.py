"""The preprocessor: OpenAI HTTP ingress, chat template, tokenization, detokenization.

Layout: errors, openai_requests (body -> request types), chat_template, tokenizer,
detokenizer, stop_strings, sse (response bytes); parsers/ (tool calls, reasoning).
"""
