"""In-process vLLM engine for NVIDIA GPUs (or any device vLLM supports). UNTESTED on this machine: no GPU.

Run it on a CUDA machine with vLLM installed (`pip install vllm`, see docs/profiling.md):

    fleetplan profile --backend vllm ...        # models mapped to Hugging Face ids with model_map

Timing: requests are added to vLLM's `LLMEngine` and driven with `step()`; after every step each request's
cumulative `RequestOutput.outputs[0].token_ids` says how many tokens it gained, and the step's end time is
the arrival time of those tokens (a step that yields k tokens for one request, e.g. with speculative
decoding or multi-step scheduling, spreads them evenly over the step, as the openai engine does).

Prompts: every request of every batch gets its own random token ids (profiler.engines.prompts.PromptSource,
reproducible from `seed`), so vLLM's prefix cache cannot turn a prefill into a cache hit. Prefix caching is
also switched off (`enable_prefix_caching=False`, unless the caller passes it), and what the engine actually
ran with, read back from its cache config per loaded model, is reported by `describe()` as `prefix_caching`
(enabled / disabled / unknown), which the profile's manifest records.

The production-faithful alternative, and the one to prefer when in doubt, is to serve the model with
`vllm serve MODEL` and profile it with `--backend openai --endpoint http://127.0.0.1:8000`: that includes
the HTTP/detokenisation path real clients see.
"""

import itertools
import socket
import time
from typing import Any

from vllm import LLM, SamplingParams  # the registry turns this ImportError into EngineUnavailable

from fleetplan.models.errors import InputError
from fleetplan.profiler.engines.base import RequestTiming
from fleetplan.profiler.engines.prompts import PromptSource, summary, vllm_prefix_caching

TOKEN_IDS = (10, 30000)  # prompt ids are drawn from [10, min(vocab, 30000)): clear of most special tokens


class VllmEngine:
    name = "vllm"

    def __init__(self, model_map: dict[str, str] | None = None, seed: int = 0, **llm_options: Any) -> None:
        self.model_map = dict(model_map or {})
        self.seed = seed
        # e.g. gpu_memory_utilization=0.9, max_model_len=8192, dtype="bfloat16". Prefix caching is off unless
        # asked for: a profile measures cold prefills.
        self.llm_options = {"enable_prefix_caching": False, **llm_options}
        self._llm: Any = None
        self._loaded: tuple[str, int] | None = None
        self._ids = itertools.count()
        self._prompts = PromptSource(seed)
        self._prefix_caching: dict[str, str] = {}  # "model@tpN" -> what the loaded engine reported

    def describe(self) -> dict[str, str]:
        import torch
        import vllm

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
        return {
            "engine": self.name,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "device": device,
            "host": socket.gethostname(),
            "models": ", ".join(f"{k}={v}" for k, v in sorted(self.model_map.items())),
            "prompts": f"distinct random token ids per request (seed {self.seed})",
            "prefix_caching": self.prefix_caching(),
        }

    def prefix_caching(self) -> str:
        """What the engines loaded so far ran with; "unknown" (with what was asked for) before any load."""
        asked = self.llm_options.get("enable_prefix_caching")
        return summary(self._prefix_caching, f"unknown (no model loaded yet; enable_prefix_caching={asked})")

    def _engine(self, model: str, tp: int) -> Any:
        if model not in self.model_map:
            raise InputError(f"model {model!r}: map it to a Hugging Face id with model_map", field="model")
        if self._loaded != (model, tp):
            self.close()  # one model per GPU set at a time
            self._llm = LLM(
                model=self.model_map[model], tensor_parallel_size=tp, seed=self.seed, **self.llm_options
            )
            self._loaded = (model, tp)
            self._prefix_caching[f"{model}@tp{tp}"] = vllm_prefix_caching(self._llm.llm_engine)
        return self._llm.llm_engine

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        engine = self._engine(model, tp)
        vocab = engine.get_tokenizer().vocab_size if hasattr(engine, "get_tokenizer") else TOKEN_IDS[1]
        params = SamplingParams(
            max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, temperature=0.0
        )
        prompts = self._prompts.batch(batch, prompt_tokens, TOKEN_IDS[0], min(vocab, TOKEN_IDS[1]))
        ids = [f"fleetplan-{next(self._ids)}" for _ in range(batch)]
        start = time.perf_counter()
        for request_id, token_ids in zip(ids, prompts, strict=True):
            engine.add_request(request_id, {"prompt_token_ids": token_ids}, params)
        arrivals: dict[str, list[tuple[float, int]]] = {request_id: [] for request_id in ids}
        seen = dict.fromkeys(ids, 0)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for output in outputs:
                if output.request_id not in seen:
                    continue
                total = len(output.outputs[0].token_ids)
                if total > seen[output.request_id]:
                    arrivals[output.request_id].append((now, total - seen[output.request_id]))
                    seen[output.request_id] = total
        from fleetplan.profiler.engines.openai_engine import _timing  # same k-tokens-per-arrival accounting

        bad = {request_id: n for request_id, n in seen.items() if n != output_tokens}
        if bad:
            raise RuntimeError(f"vLLM generated {bad} tokens, expected exactly {output_tokens} each")
        return [_timing(start, arrivals[request_id]) for request_id in ids]

    def close(self) -> None:
        if self._llm is not None:
            del self._llm
            self._llm = None
            self._loaded = None
            import gc

            gc.collect()
