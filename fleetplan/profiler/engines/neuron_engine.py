"""AWS Inferentia2 / Trainium engine through optimum-neuron. UNTESTED on this machine: no Neuron device.

Install on an inf2/trn1 instance with the Neuron SDK from AWS's own package index, NEVER from PyPI (the
PyPI names torch-neuronx, neuronx-cc, libneuronxla, transformers-neuronx are placeholders or worse):

AWS's Neuron Deep Learning AMI / container ship them in a ready venv; otherwise install them so that those
names can only come from https://pip.repos.neuron.amazonaws.com (docs/profiling.md shows how), then
`pip install optimum-neuron` in that venv.

Neuron models are compiled for a static batch size and sequence length, so each (model, tp, batch) is
compiled (or loaded from the Neuron cache) once: `num_cores = tp`, `sequence_length` = `sequence_length`
option (default 2048). Timing is the transformers engine's: one batched `generate()` with a streamer
stamping each decoding step. If the installed optimum-neuron's `generate()` does not accept `streamer=`,
serve the model with TGI-neuronx or vLLM's Neuron backend and profile it with `--backend openai`.
"""

import socket
import time
from typing import Any

import torch

# The registry turns this ImportError into EngineUnavailable.
from optimum.neuron import NeuronModelForCausalLM

from fleetplan.models.errors import InputError
from fleetplan.profiler.engines.base import RequestTiming
from fleetplan.profiler.engines.transformers_engine import _StepClock


class NeuronEngine:
    name = "neuron"

    def __init__(
        self,
        model_map: dict[str, str] | None = None,
        sequence_length: int = 2048,
        auto_cast_type: str = "bf16",
        seed: int = 0,
    ) -> None:
        self.model_map = dict(model_map or {})
        self.sequence_length = sequence_length
        self.auto_cast_type = auto_cast_type
        self._generator = torch.Generator().manual_seed(seed)
        self._models: dict[tuple[str, int, int], Any] = {}

    def describe(self) -> dict[str, str]:
        import optimum.neuron

        return {
            "engine": self.name,
            "optimum-neuron": getattr(optimum.neuron, "__version__", "unknown"),
            "torch": torch.__version__,
            "device": "AWS Neuron (see neuron-ls)",
            "host": socket.gethostname(),
            "models": ", ".join(f"{k}={v}" for k, v in sorted(self.model_map.items())),
        }

    def _model(self, model: str, tp: int, batch: int) -> Any:
        if model not in self.model_map:
            raise InputError(f"model {model!r}: map it to a Hugging Face id with model_map", field="model")
        key = (model, tp, batch)
        if key not in self._models:
            self._models[key] = NeuronModelForCausalLM.from_pretrained(
                self.model_map[model],
                export=True,
                batch_size=batch,
                sequence_length=self.sequence_length,
                num_cores=tp,
                auto_cast_type=self.auto_cast_type,
            )
        return self._models[key]

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        if prompt_tokens + output_tokens > self.sequence_length:
            raise InputError(
                f"prompt + output exceeds sequence_length={self.sequence_length}", field="prompt_tokens"
            )
        net = self._model(model, tp, batch)
        vocab = int(net.config.vocab_size)
        input_ids = torch.randint(10, min(vocab, 30000), (batch, prompt_tokens), generator=self._generator)
        clock = _StepClock()
        start = time.perf_counter()
        net.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=output_tokens,
            min_new_tokens=output_tokens,
            do_sample=False,
            eos_token_id=None,
            streamer=clock,
        )
        if len(clock.times) != output_tokens:
            raise RuntimeError(f"timed {len(clock.times)} steps, expected {output_tokens}")
        gaps = tuple(b - a for a, b in zip(clock.times, clock.times[1:], strict=False))
        return [RequestTiming(ttft_s=clock.times[0] - start, gaps_s=gaps) for _ in range(batch)]

    def close(self) -> None:
        self._models.clear()
