"""Prompts no cache can shortcut, and what an engine says about its prefix cache.

A profile's TTFT must be the cost of a cold prefill of `prompt_tokens` tokens. Serving engines keep the KV
blocks of earlier prompts (vLLM's automatic prefix caching, on by default in its V1 engine; TGI's and
SGLang's prefix caches): a prompt that shares a prefix with an earlier one recomputes only its tail, so
profiling with repeated prompts measures cache hits. Hence, for every engine:

- `PromptSource`: a deterministic stream (same seed, same sequence of calls, same prompts) of prompts of
  exactly `prompt_tokens` token ids drawn uniformly from [low, high), fresh for every request of every
  batch. The first ids of the requests of one batch are drawn without replacement (while the range has
  enough ids), so no two prompts of a batch share even their first token, and a block-chained prefix cache
  (vLLM hashes each block with its predecessors) shares no block between them. Across batches the draws
  are independent: two prompts share a first 16-token block with probability (high - low) ** -16.
- `text_prompts`: the same for servers that only take text: distinct random words, checked to encode to
  exactly `tokens` tokens.
- `vllm_prefix_caching`, `prefix_caching_from_metrics`: whether the engine has prefix caching on, read from
  vLLM's engine config in process or from a vLLM server's Prometheus `/metrics` (`vllm:cache_config_info`);
  `UNKNOWN` where neither says. Engines report it as `prefix_caching` in `describe()`, which the profile's
  manifest records (`engine.prefix_caching`).
"""

import random
import re
from typing import Any

from fleetplan.models.errors import InputError

ENABLED = "enabled"
DISABLED = "disabled"
UNKNOWN = "unknown"


class PromptSource:
    """Distinct random token-id prompts, one per request, reproducible from `seed`."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)  # the one stream every prompt of this source is drawn from

    def batch(self, batch: int, prompt_tokens: int, low: int, high: int) -> list[list[int]]:
        """`batch` prompts of exactly `prompt_tokens` ids in [low, high); first ids distinct if possible."""
        if batch < 1 or prompt_tokens < 1:
            msg = f"batch and prompt_tokens must be at least 1, got {batch} and {prompt_tokens}"
            raise InputError(msg, field="prompt_tokens")
        if not 0 <= low < high:
            raise InputError(f"token id range [{low}, {high}) is empty", field="token_id_range")
        span = range(low, high)
        firsts: list[int] = []
        while len(firsts) < batch:  # without replacement, then again once every id has been used
            firsts += self.rng.sample(span, min(batch - len(firsts), len(span)))
        return [[first, *self.rng.choices(span, k=prompt_tokens - 1)] for first in firsts]


# Common English words that are one token each, with their leading space, in the Llama 2/3, Mistral and GPT
# tokenizers; `text_prompts` checks the count anyway.
WORDS = tuple(
    f" {word}"
    for word in (
        "the of and to in is that for it as was with be by on not he this are or his from at which but "
        "have an had they you were their one all we can her has there been if more when will would who so "
        "no time people year way day man thing woman life child world school state family student group "
        "country problem hand part place case week company system program question work government number "
        "night point home water room mother area money story fact month lot right study book eye job word "
        "business issue side kind head house service friend father power hour game line end member law "
        "car city name team"
    ).split()
)


def text_prompts(tokenizer: Any, batch: int, tokens: int, rng: random.Random) -> list[str]:
    """`batch` texts of random words, each encoding to exactly `tokens` tokens with `tokenizer` (anything
    with `encode(text, add_special_tokens=False)`), the first words of a batch distinct where possible."""
    firsts: list[str] = []
    while len(firsts) < batch:
        firsts += rng.sample(WORDS, min(batch - len(firsts), len(WORDS)))
    return [_text_of_length(tokenizer, tokens, first, rng) for first in firsts]


def _text_of_length(tokenizer: Any, tokens: int, first: str, rng: random.Random) -> str:
    words = [first, *rng.choices(WORDS, k=tokens - 1)]
    for _ in range(8):  # one word is one token in the usual tokenizers: trim or extend until it is exact
        text = "".join(words)
        count = len(tokenizer.encode(text, add_special_tokens=False))
        if count == tokens:
            return text
        if count > tokens and len(words) > 1:
            words = words[: max(1, len(words) - (count - tokens))]
        else:
            words += rng.choices(WORDS, k=max(1, tokens - count))
    raise InputError(
        f"could not build a text of exactly {tokens} tokens with this tokenizer", field="tokenizer"
    )


def vllm_prefix_caching(llm_engine: Any) -> str:
    """ENABLED / DISABLED from a vLLM engine's cache config (V0 and V1 `LLMEngine` keep it as `cache_config`,
    newer ones under `vllm_config`), UNKNOWN if it has neither or the setting is unresolved (None)."""
    config = getattr(llm_engine, "cache_config", None)
    if config is None:
        config = getattr(getattr(llm_engine, "vllm_config", None), "cache_config", None)
    value = getattr(config, "enable_prefix_caching", None)
    if isinstance(value, bool):
        return ENABLED if value else DISABLED
    return UNKNOWN


_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_PREFIX_LABEL = re.compile(r'(?:^|,)\s*enable_prefix_caching="(?P<value>[^"]*)"')


def prefix_caching_from_metrics(text: str) -> str:
    """ENABLED / DISABLED from a vLLM server's Prometheus exposition (`vllm:cache_config_info` carries the
    engine's cache config as labels), UNKNOWN if it is absent or engines disagree."""
    values = set()
    for match in _CACHE_INFO.finditer(text):
        label = _PREFIX_LABEL.search(match.group("labels"))
        if label:
            values.add(label.group("value").strip().lower())
    if values == {"true"}:
        return ENABLED
    if values == {"false"}:
        return DISABLED
    return UNKNOWN


def summary(states: dict[str, str], unloaded: str) -> str:
    """One manifest value for per-model states: the state if all agree, else `model=state, ...`;
    `unloaded` where nothing was loaded in this process."""
    if not states:
        return unloaded
    if len(set(states.values())) == 1:
        return next(iter(states.values()))
    return ", ".join(f"{name}={state}" for name, state in sorted(states.items()))


__all__ = [
    "DISABLED",
    "ENABLED",
    "UNKNOWN",
    "WORDS",
    "PromptSource",
    "prefix_caching_from_metrics",
    "summary",
    "text_prompts",
    "vllm_prefix_caching",
]
