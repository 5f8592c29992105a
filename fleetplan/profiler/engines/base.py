"""The one small protocol every engine backend implements, and the registry that picks one by name.

An engine runs one *batch*: `batch` requests with prompts of exactly `prompt_tokens` tokens, each generating
exactly `output_tokens` tokens, started together, and reports per request the time to first token and every
inter-token gap. How it starts them together is its own business: the in-process `transformers` engine
runs one batched generate(), the `openai` engine opens `batch` concurrent streams.
"""

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from fleetplan.models.errors import InputError


@dataclass(frozen=True)
class RequestTiming:
    """One request: seconds to its first token and between each later token (len = tokens - 1)."""

    ttft_s: float
    gaps_s: tuple[float, ...]


class Engine(Protocol):
    name: str

    def describe(self) -> dict[str, str]:
        """What the manifest records: engine, versions, device, host, model ids."""
        ...

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        """Run one batch and time every request in it."""
        ...

    def close(self) -> None:
        """Release the model, connections, threads."""
        ...


class EngineUnavailable(InputError):
    """An engine's packages are not installed here; the message says what to install and from where."""


# name -> (module, factory attribute, what to install when the import fails)
ENGINES: dict[str, tuple[str, str, str]] = {
    "transformers": (
        "fleetplan.profiler.engines.transformers_engine",
        "TransformersEngine",
        "pip install 'fleetplan[profile-cpu]' (torch CPU build + transformers)",
    ),
    "openai": (
        "fleetplan.profiler.engines.openai_engine",
        "OpenAIEngine",
        "pip install 'fleetplan[profile]' (httpx)",
    ),
    "vllm": (
        "fleetplan.profiler.engines.vllm_engine",
        "VllmEngine",
        "pip install vllm on a CUDA machine (docs/profiling.md); or serve vLLM and use --backend openai",
    ),
    "neuron": (
        "fleetplan.profiler.engines.neuron_engine",
        "NeuronEngine",
        "the AWS Neuron SDK from AWS's own package index, never from PyPI (docs/profiling.md)",
    ),
    "jetstream": (
        "fleetplan.profiler.engines.jetstream_engine",
        "JetStreamEngine",
        "JetStream / jetstream-pytorch from their GitHub sources on a TPU VM, "
        "never from PyPI (docs/profiling.md)",
    ),
    "analytic": ("fleetplan.profiler.engines.analytic_engine", "AnalyticEngine", "nothing: it is built in"),
}


def get_engine(name: str, **options: Any) -> Engine:
    """The engine called `name`, constructed with `options`; EngineUnavailable names what to install."""
    if name not in ENGINES:
        msg = f"unknown engine {name!r}; choose one of {sorted(ENGINES)}"
        raise InputError(msg, field="backend")
    module_name, factory, install = ENGINES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        msg = f"engine {name!r} needs {error.name!r}, which is not installed: {install}"
        raise EngineUnavailable(msg, field="backend") from error
    try:
        engine: Engine = getattr(module, factory)(**options)
    except TypeError as error:  # an option the engine's constructor does not take
        msg = f"engine {name!r} does not accept these options ({error}); options given: {sorted(options)}"
        raise InputError(msg, field="engine_option") from error
    return engine
