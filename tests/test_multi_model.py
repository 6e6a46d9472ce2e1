"""Two models with different tokenizers behind one preprocessor: each request is tokenized and
templated with its own model's tokenizer, fetched from that model's engine."""

from __future__ import annotations

import time

import httpx
import openai
from e2e_stack import Processes, running_stack
from support.mock_engine import tokenizer_dir_with_template

from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
QUESTION = [{"role": "user", "content": "Which track does the night freight take?"}]


def test_each_model_uses_its_own_tokenizer(tmp_path):
    other = tokenizer_dir_with_template(tmp_path / "yard-chat", TEMPLATE)

    with Processes() as procs:
        a = procs.start_ready(
            "engine-a", "mock-engine", "--protocol", "sglang", "--port", "0",
            "--model-name", "deepseek-mock",
        )  # fmt: skip
        b = procs.start_ready(
            "engine-b", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--model-name", "yard-chat", "--tokenizer", str(other),
        )  # fmt: skip
        ports = {"deepseek-mock": a.result()["port"], "yard-chat": b.result()["port"]}
        workers = []
        for port in ports.values():
            workers += ["--worker", f"grpc://127.0.0.1:{port}"]
        with running_stack(*workers) as stack:
            models = httpx.get(stack.base_url + "/v1/models", timeout=10).json()
            assert {m["id"] for m in models["data"]} == set(ports)
            with openai.OpenAI(
                base_url=stack.base_url + "/v1", api_key="none", max_retries=0
            ) as client:
                # The stack is ready once one model's tokenizer is in; the other may follow.
                usage = {}
                for model in ports:
                    for _ in range(50):
                        try:
                            reply = client.chat.completions.create(
                                model=model, messages=QUESTION, max_tokens=2
                            )
                            break
                        except openai.APIStatusError as exc:
                            assert exc.status_code == 503, exc
                            time.sleep(0.2)
                    usage[model] = reply.usage.prompt_tokens
            default = TokenizerBundle.from_dir(default_tokenizer_dir())
            own = TokenizerBundle.from_dir(other)
            assert own.chat_template.render(QUESTION).startswith("[user] Which track")
            assert usage["yard-chat"] == len(own.encode(own.chat_template.render(QUESTION)))
            assert usage["deepseek-mock"] == len(
                default.encode(default.chat_template.render(QUESTION))
            )
            assert usage["yard-chat"] != usage["deepseek-mock"]
            assert "tokenizer of model 'yard-chat' fetched" in stack.log()
