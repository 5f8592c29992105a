"""Google TPU (v5e, ...) engine: a client of a running JetStream server. UNTESTED on this machine: no TPU.

JetStream generates inside its orchestrator server, so per-token times can only be observed from outside
it: this engine opens `batch` concurrent streaming `Decode` gRPC calls to the server and stamps each
streamed response. Set up on the TPU VM from the projects' GitHub sources, NEVER from PyPI (the PyPI name
`jetstream-pt` is not Google's package):

    git clone https://github.com/AI-Hypercomputer/jetstream-pytorch
    cd jetstream-pytorch && source install_everything.sh
    jpt serve --model_id meta-llama/Llama-3.1-8B ...          # gRPC on port 9000 (docs/profiling.md)
    fleetplan profile --backend jetstream ...                 # JetStreamEngine(endpoint="127.0.0.1:9000")

If the server also exposes its OpenAI-compatible HTTP front end, `--backend openai` against it measures the
same thing through HTTP. JetStream's DecodeRequest has no min_tokens/ignore_eos: a stream that ends early
(end-of-sequence) is reported as an error rather than as short timings; use a model/prompt that does not
stop, or the openai route with a server that honours ignore_eos. `tp` is the server's configuration
(its sharding flags); it is recorded, not applied.
"""

import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

# The registry turns this ImportError into EngineUnavailable. The import is absolute-first on purpose:
# jetstream before grpc (which it needs anyway), so a missing JetStream is what the error names.
import jetstream.core.proto.jetstream_pb2 as jetstream_pb2
import jetstream.core.proto.jetstream_pb2_grpc as jetstream_pb2_grpc
from grpc import RpcError, insecure_channel
from grpc import __version__ as grpc_version

from fleetplan.profiler.engines.base import RequestTiming
from fleetplan.profiler.engines.openai_engine import EndpointError, _timing


class JetStreamEngine:
    name = "jetstream"

    def __init__(
        self, endpoint: str = "127.0.0.1:9000", seed: int = 0, token_id_range: tuple[int, int] = (10, 500)
    ):
        self.endpoint = endpoint
        self._channel = insecure_channel(endpoint)
        self._stub = jetstream_pb2_grpc.OrchestratorStub(self._channel)
        self._random = random.Random(seed)
        self.token_id_range = token_id_range

    def describe(self) -> dict[str, str]:
        return {
            "engine": self.name,
            "endpoint": self.endpoint,
            "grpc": grpc_version,
            "host": socket.gethostname(),
        }

    def _one(self, prompt: list[int], output_tokens: int) -> RequestTiming:
        request = jetstream_pb2.DecodeRequest(
            token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=prompt), max_tokens=output_tokens
        )
        arrivals: list[tuple[float, int]] = []
        start = time.perf_counter()
        try:
            for response in self._stub.Decode(request):
                now = time.perf_counter()
                tokens = sum(len(sample.token_ids) for sample in response.stream_content.samples)
                if tokens:
                    arrivals.append((now, tokens))
        except RpcError as error:
            raise EndpointError(f"JetStream at {self.endpoint}: {error.code()} {error.details()}") from error
        counted = sum(tokens for _, tokens in arrivals)
        if counted != output_tokens:
            raise EndpointError(
                f"JetStream at {self.endpoint} streamed {counted} tokens, expected {output_tokens}"
            )
        return _timing(start, arrivals)

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        low, high = self.token_id_range
        prompts = [[self._random.randrange(low, high) for _ in range(prompt_tokens)] for _ in range(batch)]
        with ThreadPoolExecutor(max_workers=batch) as pool:
            return list(pool.map(lambda prompt: self._one(prompt, output_tokens), prompts))

    def close(self) -> None:
        self._channel.close()
