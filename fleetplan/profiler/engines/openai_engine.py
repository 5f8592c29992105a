"""Engine for any OpenAI-compatible streaming server: vLLM, TGI, JetStream's HTTP server, NVIDIA NIM, ...

`run_batch` opens `batch` concurrent streaming requests to `{endpoint}/v1/completions` and times the
server-sent events of each as they arrive.

What is sent: `stream: true`, `max_tokens = min_tokens = output_tokens` and `ignore_eos: true` (vLLM's
extensions, so the server generates exactly `output_tokens` tokens; servers that do not know them usually
ignore them), and the prompt as a list of token ids of exactly `prompt_tokens` ids (the completions API
accepts token-id arrays), fresh random ids for every request, distinct within a batch from the first id on
(profiler.engines.prompts.PromptSource), so a prefix cache cannot shortcut the prefill. With `tokenizer=` (a
Hugging Face tokenizer id/path, or any object with `encode(text, add_special_tokens=False)`) the prompt is
text of random words checked to encode to exactly `prompt_tokens` tokens instead, again distinct per request,
for servers that take text only. `stream_options.include_usage` (+ vLLM's `continuous_usage_stats`) is asked
for when `usage_stats` is true, so chunks can say how many tokens they carry.

Prefix caching is the server's setting (`vllm serve --no-enable-prefix-caching` turns it off): `describe()`
reports it as `prefix_caching`, read from the server's Prometheus `/metrics` (vLLM's
`vllm:cache_config_info`), or "unknown" where the server does not say.

Token accounting: TTFT = arrival of the first chunk carrying a token - start of that request. A chunk
carries the number of tokens its cumulative `usage.completion_tokens` grew by when the server reports it,
otherwise one token per chunk with non-empty text. When one chunk carries k > 1 tokens, their arrival
times are spread evenly over the interval since the previous chunk (each of the k gaps is the interval / k;
k tokens in the very first chunk all arrive at TTFT, gaps 0). If the stream ends with a different number
of tokens than `output_tokens`, the batch fails with EndpointError rather than report wrong gaps.

The HTTP client lives on a private event loop in a daemon thread, so `run_batch` works both from plain
code and from inside someone else's running event loop, and keeps connections alive across batches.
"""

import asyncio
import json
import socket
import threading
import time
from typing import Any

import httpx

from fleetplan.models.errors import EndpointError, InputError
from fleetplan.profiler.engines.base import RequestTiming
from fleetplan.profiler.engines.prompts import (
    UNKNOWN,
    PromptSource,
    prefix_caching_from_metrics,
    text_prompts,
)


class OpenAIEngine:
    """Times `batch` concurrent streaming completions against one OpenAI-compatible endpoint."""

    name = "openai"

    def __init__(
        self,
        endpoint: str,
        model_map: dict[str, str] | None = None,
        api_key: str | None = None,
        timeout_s: float = 120,
        tokenizer: Any = None,
        usage_stats: bool = True,
        token_id_range: tuple[int, int] = (10, 500),
        seed: int = 0,
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise InputError(f"endpoint {endpoint!r} must start with http:// or https://", field="endpoint")
        base = endpoint.rstrip("/")
        self.endpoint = base[: -len("/v1")] if base.endswith("/v1") else base
        self.url = f"{self.endpoint}/v1/completions"
        self.model_map = dict(model_map or {})
        self.timeout_s = timeout_s
        self.usage_stats = usage_stats
        low, high = token_id_range
        if not 0 <= low < high:
            raise InputError(
                f"token_id_range {token_id_range} must be 0 <= low < high", field="token_id_range"
            )
        self.token_id_range = (low, high)
        self._prompts = PromptSource(seed)
        self._headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._tokenizer_name = tokenizer if isinstance(tokenizer, str) else None
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer  # only with tokenizer=: the profile extra does not need it

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self._tokenizer = tokenizer
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-engine-loop", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    # -- engine protocol -----------------------------------------------------------------------------------

    def describe(self) -> dict[str, str]:
        info = {
            "engine": self.name,
            "endpoint": self.endpoint,
            "httpx": httpx.__version__,
            "host": socket.gethostname(),
            "models": ", ".join(f"{k}={v}" for k, v in sorted(self.model_map.items())) or "(names as given)",
            "prompt": f"distinct random text per request via tokenizer {self._tokenizer_name}"
            if self._tokenizer is not None
            else f"distinct random token ids per request in {list(self.token_id_range)}",
        }
        server = self._call(self._server_models())
        if server:
            info["server_models"] = server
        info["prefix_caching"] = self._call(self._prefix_caching())
        return info

    def run_batch(
        self, model: str, tp: int, batch: int, prompt_tokens: int, output_tokens: int
    ) -> list[RequestTiming]:
        # tp is the server's business (e.g. `vllm serve --tensor-parallel-size`): recorded, not applied.
        for field, value in (
            ("batch", batch),
            ("prompt_tokens", prompt_tokens),
            ("output_tokens", output_tokens),
        ):
            if value < 1:
                raise InputError(f"must be at least 1, got {value}", field=field)
        if tp < 1:
            raise InputError(f"must be at least 1, got {tp}", field="tp")
        served = self.model_map.get(model, model)
        return self._call(self._batch(served, self.prompts(batch, prompt_tokens), output_tokens))

    def close(self) -> None:
        if self._closed:
            return
        if self._client is not None:
            self._call(self._client.aclose())
            self._client = None
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    # -- internals -----------------------------------------------------------------------------------------

    def _call(self, coroutine: Any) -> Any:
        if self._closed:
            raise RuntimeError(f"the openai engine for {self.endpoint} is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            )
        return self._client

    def prompts(self, batch: int, prompt_tokens: int) -> list[list[int]] | list[str]:
        """The next batch's prompts: token ids, or texts with a tokenizer; distinct per request."""
        if self._tokenizer is None:
            return self._prompts.batch(batch, prompt_tokens, *self.token_id_range)
        return text_prompts(self._tokenizer, batch, prompt_tokens, self._prompts.rng)

    async def _prefix_caching(self) -> str:
        try:
            response = await self._http().get(f"{self.endpoint}/metrics")
        except httpx.HTTPError:
            return f"{UNKNOWN} (no /metrics)"
        if response.status_code != 200:
            return f"{UNKNOWN} (no /metrics)"
        state = prefix_caching_from_metrics(response.text)
        return f"{UNKNOWN} (/metrics does not say)" if state == UNKNOWN else state

    async def _server_models(self) -> str:
        try:
            response = await self._http().get(f"{self.endpoint}/v1/models")
            if response.status_code != 200:
                return ""
            return ", ".join(str(m.get("id")) for m in response.json().get("data", []))
        except (httpx.HTTPError, ValueError, AttributeError):
            return ""

    async def _batch(self, model: str, prompts: list[Any], output_tokens: int) -> list[RequestTiming]:
        return list(await asyncio.gather(*(self._one(model, p, output_tokens) for p in prompts)))

    async def _one(self, model: str, prompt: Any, output_tokens: int) -> RequestTiming:
        """Stream one completion and time its tokens; EndpointError for whatever keeps that from working."""
        body = self._body(model, prompt, output_tokens)
        tokens = _TokenCount(self.url)
        try:
            start = time.perf_counter()
            async with self._http().stream("POST", self.url, json=body) as response:
                await self._read_stream(response, tokens)
        except httpx.ConnectError as error:
            raise EndpointError(f"cannot connect to {self.url}: {error}", field="endpoint") from error
        except httpx.TimeoutException as error:
            msg = f"{self.url} did not answer within {self.timeout_s} s ({type(error).__name__})"
            raise EndpointError(msg, field="endpoint") from error
        except httpx.HTTPError as error:
            raise EndpointError(f"{self.url}: {type(error).__name__}: {error}", field="endpoint") from error
        except json.JSONDecodeError as error:
            raise EndpointError(
                f"{self.url} streamed an event that is not JSON: {error}", field="endpoint"
            ) from error
        tokens.check(output_tokens)
        return _timing(start, tokens.arrivals)

    def _body(self, model: str, prompt: Any, output_tokens: int) -> dict[str, Any]:
        """The completion request: streamed, exactly `output_tokens` tokens, usage in every chunk if asked."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": output_tokens,
            "min_tokens": output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        if self.usage_stats:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    async def _read_stream(self, response: httpx.Response, tokens: "_TokenCount") -> None:
        """Count the tokens of each `data:` event as it arrives, up to [DONE], then drain the body; an
        EndpointError for an HTTP error status."""
        if response.status_code >= 400:
            detail = (await response.aread()).decode("utf-8", "replace")[:500]
            msg = f"{self.url} answered HTTP {response.status_code}: {detail}"
            raise EndpointError(msg, field="endpoint")
        done = False
        async for line in response.aiter_lines():
            now = time.perf_counter()
            if done or not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines; after [DONE], drain the body
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True  # read on to the end so the connection can be kept alive
                continue
            tokens.add(json.loads(data), now)


class _TokenCount:
    """The tokens one stream carried, chunk by chunk: (arrival time, tokens) per chunk that carried any."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.arrivals: list[tuple[float, int]] = []  # (time, tokens this chunk carried)
        self.counted = 0  # tokens accounted so far
        self.reported: int | None = None  # last cumulative usage.completion_tokens seen
        self.guessed = 0  # tokens counted one per text chunk, for want of usage in the chunk

    def add(self, chunk: Any, now: float) -> None:
        """Account one streamed chunk, arrived at `now`: by its usage if it reports one, else one token per
        chunk with text; EndpointError for a streamed error or tokens hidden in earlier chunks."""
        if "error" in chunk:
            raise EndpointError(f"{self.url} streamed an error: {chunk['error']}", field="endpoint")
        usage = chunk.get("usage") or {}
        text = "".join(str(c.get("text") or "") for c in chunk.get("choices") or [])
        if isinstance(usage.get("completion_tokens"), int):
            self.reported = usage["completion_tokens"]
            tokens = max(0, self.reported - self.counted)
            if self.guessed and tokens > max(HIDDEN_TOLERATED, self.reported // 20):
                raise EndpointError(_hidden_tokens(self.url, self.guessed, self.reported), field="endpoint")
        else:
            tokens = 1 if text else 0
            self.guessed += tokens
        if tokens:
            self.arrivals.append((now, tokens))
            self.counted += tokens

    def check(self, output_tokens: int) -> None:
        """EndpointError unless the stream carried exactly `output_tokens` tokens."""
        if self.counted != output_tokens:
            msg = (
                f"{self.url} streamed {self.counted} tokens (usage said {self.reported}), "
                f"expected exactly {output_tokens}: "
                "the server must honour max_tokens/min_tokens/ignore_eos and stream one token per chunk or "
                "report usage in every chunk"
            )
            raise EndpointError(msg, field="endpoint")


# tokens a stream without per-chunk usage may merge into other chunks before its batch fails (or 5% of
# them): a detokenizer holding back a partial UTF-8 character merges one now and then, which skews a gap;
# a server sending two tokens per chunk hides half of them
HIDDEN_TOLERATED = 1


def _hidden_tokens(url: str, guessed: int, reported: int) -> str:
    """A stream whose text chunks, counted one token each, fall short of the usage reported after them: the
    chunks carried several tokens each, at times the stream does not tell (spreading the missing ones over
    the last interval measured a 10 ms TBT at 2.5 ms p50)."""
    return (
        f"{url} streamed {guessed} text chunks without usage, then usage of {reported} tokens: its chunks "
        "carry several tokens each and say so only at the end, so their times are unknown; report usage in "
        "every chunk (vLLM: stream_options.continuous_usage_stats) or stream one token per chunk"
    )


def _timing(start: float, arrivals: list[tuple[float, int]]) -> RequestTiming:
    """Per-token times from chunk arrivals; a chunk of k tokens spreads them over the interval before it."""
    times: list[float] = []
    first_time, first_tokens = arrivals[0]
    times.extend([first_time] * first_tokens)
    previous = first_time
    for arrival, tokens in arrivals[1:]:
        step = (arrival - previous) / tokens
        times.extend(previous + step * (i + 1) for i in range(tokens))
        previous = arrival
    gaps = tuple(later - earlier for earlier, later in zip(times, times[1:], strict=False))
    return RequestTiming(ttft_s=times[0] - start, gaps_s=gaps)
