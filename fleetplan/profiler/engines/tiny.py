"""The random-weight "tiny-llama" model, built in memory: no download, no tokenizer, same weights per seed.

Shared by the `transformers` engine and the test-suite's local OpenAI-compatible server
(tests/openai_server.py), so both time the very same network.
"""

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fleetplan.models.workload import CATALOG

TINY_MODEL = "tiny-llama"
TINY_VOCAB_SIZE = 512
# 16x hidden: enough MLP work per prompt token that TTFT visibly grows with the prompt on a CPU, where
# generate()'s fixed per-call cost dominates otherwise (the planner's KV bytes do not depend on it).
TINY_INTERMEDIATE_SIZE = 1024
# Longest prompt + output the tiny model accepts (rotary embeddings are computed for any length, but the
# config says what we promise): prompts up to 2048 tokens plus room for the output.
TINY_MAX_POSITIONS = 4096


def tiny_config() -> LlamaConfig:
    """A LlamaConfig with the shape CATALOG["tiny-llama"] records (the planner's KV bytes match it)."""
    spec = CATALOG[TINY_MODEL]
    assert spec.layers
    assert spec.kv_heads
    assert spec.head_dim
    assert spec.hidden_size
    return LlamaConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=spec.hidden_size,
        intermediate_size=TINY_INTERMEDIATE_SIZE,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.hidden_size // spec.head_dim,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=TINY_MAX_POSITIONS,
        # No real tokens: pad is 0 and there is no end-of-sequence token, so generation never stops early.
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )


def build_tiny_model(seed: int = 0, device: str = "cpu") -> Any:
    """tiny-llama with weights drawn from `seed`, float32, in eval mode, on `device`."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config()).to(dtype=torch.float32, device=device)
    model.eval()
    # generate() reads its defaults here: never stop on an end-of-sequence token.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def random_prompt(
    batch: int, prompt_tokens: int, vocab_size: int, generator: torch.Generator
) -> torch.Tensor:
    """[batch, prompt_tokens] random ids in 1..vocab-1 (0 is pad): exact lengths without a tokenizer."""
    return torch.randint(1, vocab_size, (batch, prompt_tokens), generator=generator, dtype=torch.long)
