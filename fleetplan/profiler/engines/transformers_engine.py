"""In-process Hugging Face transformers engine: one batched `generate()`, timed token by token.

"tiny-llama" is built in memory with random weights (fleetplan/profiler/engines/tiny.py): no download, so
tests and demos can run it anywhere. Any other model is loaded with `AutoModelForCausalLM.from_pretrained`
only when the caller maps it explicitly, `models={"llama-3.2-1b": "meta-llama/Llama-3.2-1B"}` (real
weights: the caller's choice, never done implicitly and never in tests).

Timing: a streamer's `put()` is called by `generate()` once with the prompt, then once per decoding step
with that step's tokens for the whole batch. Every request in the batch gets the same step times (they are
decoded in lockstep): TTFT = first step time - start of generate(); gaps = differences of step times.

Prompts are fresh random ids for every row of every batch (one generator seeded once). `generate()` keeps no
KV cache between calls and shares none between the rows of a batch, so there is no prefix cache to hit:
`describe()` reports `prefix_caching` as disabled.
"""

import platform
import socket
import time
from typing import Any

import torch
import transformers
from transformers.generation.streamers import BaseStreamer

from fleetplan.models.errors import InputError
from fleetplan.profiler.engines.base import RequestTiming
from fleetplan.profiler.engines.prompts import DISABLED
from fleetplan.profiler.engines.tiny import TINY_MODEL, build_tiny_model, random_prompt


class _StepClock(BaseStreamer):
    """Records `time.perf_counter()` at every decoding step; the first `put()` (the prompt) is skipped."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.times: list[float] = []
        self.ended = False

    def put(self, value: Any) -> None:
        now = time.perf_counter()
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(now)

    def end(self) -> None:
        self.ended = True


class TransformersEngine:
    """Runs batches through one in-process model per planner model name."""

    name = "transformers"

    def __init__(self, device: str = "cpu", seed: int = 0, models: dict[str, str] | None = None) -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            msg = (
                f"device {device!r} asked for, but this torch build ({torch.__version__}) sees no CUDA device"
            )
            raise InputError(msg, field="device")
        self.device = device
        self.seed = seed
        self.model_ids: dict[str, str] = dict(models or {})
        self._models: dict[str, Any] = {}
        self._generator = torch.Generator().manual_seed(seed)

    # -- models --------------------------------------------------------------------------------------------

    def _model(self, model: str) -> Any:
        if model not in self._models:
            if model in self.model_ids:
                from transformers import AutoModelForCausalLM

                loaded = AutoModelForCausalLM.from_pretrained(self.model_ids[model])
                loaded.to(self.device)
                loaded.eval()
                self._models[model] = loaded
            elif model == TINY_MODEL:
                self._models[model] = build_tiny_model(self.seed, self.device)
            else:
                msg = (
                    f"model {model!r}: the transformers engine builds only {TINY_MODEL!r} by itself; to "
                    f'load real weights pass --engine-option models=\'{{"{model}": "<hugging face id or '
                    "local path>\"}'"
                )
                raise InputError(msg, field="model")
        return self._models[model]

    # -- engine protocol -----------------------------------------------------------------------------------

    def describe(self) -> dict[str, str]:
        if self.device.startswith("cuda"):
            device = torch.cuda.get_device_name(torch.device(self.device))
        else:
            device = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        ids = {TINY_MODEL: f"{TINY_MODEL} (random weights, seed {self.seed})", **self.model_ids}
        return {
            "engine": self.name,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device,
            "host": socket.gethostname(),
            "models": ", ".join(f"{name}={source}" for name, source in sorted(ids.items())),
            "prompts": f"random token ids per request (seed {self.seed})",
            "prefix_caching": f"{DISABLED} (generate() keeps no KV cache between calls)",
        }

    def validate_grid(self, grid) -> None:
        """Refuse, before anything is measured, a grid this engine cannot run: tp above 1, a model it
        cannot build or load, a prompt and output beyond a model's positions. Found at the point that
        reached them, these left measured rows behind that a corrected grid could not resume (session 34)."""
        if any(tp != 1 for tp in grid.tp):
            raise InputError(
                f"the transformers engine runs on one device only; got tp={list(grid.tp)}", field="tp"
            )
        for model in grid.models:
            limit = getattr(self._model(model).config, "max_position_embeddings", None)
            total = max(grid.prompts) + grid.output_tokens
            if limit is not None and total > limit:
                msg = f"prompt + output = {total} tokens exceeds the {limit} positions of model {model!r}"
                raise InputError(msg, field="prompt_tokens")

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        if tp != 1:
            raise InputError(f"the transformers engine runs on one device only; got tp={tp}", field="tp")
        for field, value in (
            ("batch", batch),
            ("prompt_tokens", prompt_tokens),
            ("output_tokens", output_tokens),
        ):
            if value < 1:
                raise InputError(f"must be at least 1, got {value}", field=field)
        net = self._model(model)
        limit = getattr(net.config, "max_position_embeddings", None)
        if limit is not None and prompt_tokens + output_tokens > limit:
            total = prompt_tokens + output_tokens
            msg = f"prompt + output = {total} tokens exceeds the {limit} positions of model {model!r}"
            raise InputError(msg, field="prompt_tokens")
        vocab = int(net.config.vocab_size)
        input_ids = random_prompt(batch, prompt_tokens, vocab, self._generator).to(self.device)
        attention_mask = torch.ones_like(input_ids)
        clock = _StepClock()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        with torch.inference_mode():
            start = time.perf_counter()
            out = net.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=output_tokens,
                min_new_tokens=output_tokens,
                do_sample=False,
                # No end-of-sequence token: every request generates exactly output_tokens tokens.
                eos_token_id=None,
                pad_token_id=net.generation_config.pad_token_id
                if net.generation_config.pad_token_id is not None
                else 0,
                streamer=clock,
            )
        generated = out.shape[-1] - prompt_tokens
        if generated != output_tokens or len(clock.times) != output_tokens:
            msg = (
                f"model {model!r} generated {generated} tokens ({len(clock.times)} timed steps), "
                f"expected exactly {output_tokens}"
            )
            raise RuntimeError(msg)
        ttft = clock.times[0] - start
        gaps = tuple(later - earlier for earlier, later in zip(clock.times, clock.times[1:], strict=False))
        return [RequestTiming(ttft_s=ttft, gaps_s=gaps) for _ in range(batch)]

    def close(self) -> None:
        self._models.clear()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
