"""A real, local, OpenAI-compatible streaming server over the random-weight tiny-llama, for tests.

`serve_tiny()` binds 127.0.0.1 on a free port and serves, one thread per connection (HTTP/1.1 keep-alive,
chunked transfer encoding):

- `GET /v1/models`
- `POST /v1/completions` with `stream: true`: greedy decoding, one forward pass per token through
  `past_key_values`, one `data: {"choices":[{"text": ..., "index": 0}]}` event per token (or per
  `chunk_tokens` tokens), then `data: [DONE]`. `stream_options.include_usage` adds a final usage event,
  `continuous_usage_stats` a cumulative `usage` in every event (as vLLM does). Without `stream` it answers
  one JSON completion. `prompt` is a list of token ids or a text (each whitespace-separated word -> one id).

It generates exactly `max_tokens` tokens (the tiny model has no end-of-sequence token). Unknown models
-> 404, bad bodies -> 400, both as OpenAI-style `{"error": {...}}`.

Run it by hand: `python tests/openai_server.py --port 8011`.
"""

import argparse
import contextlib
import json
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from fleetplan.profiler.engines.tiny import TINY_MODEL, build_tiny_model


class TinyServer(ThreadingHTTPServer):
    daemon_threads = True
    # Many concurrent connections at once (a batch opens one each): the default backlog of 5 is too small.
    request_queue_size = 256

    def __init__(
        self, address: tuple[str, int], seed: int = 0, chunk_tokens: int = 1, continuous_usage: bool = True
    ) -> None:
        super().__init__(address, _Handler)
        self.model = build_tiny_model(seed)
        self.vocab = int(self.model.config.vocab_size)
        self.chunk_tokens = chunk_tokens
        # False: ignore continuous_usage_stats (usage only in the final event, as servers without it do)
        self.continuous_usage = continuous_usage

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up mid-stream is normal (timeouts, cancelled tests): no traceback on stderr."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Small SSE writes must leave at once: no Nagle delay (it would add ~40 ms to a token now and then).
    disable_nagle_algorithm = True
    server: TinyServer

    def log_message(self, format: str, *args: Any) -> None:  # the base class's parameter name
        pass  # quiet under pytest

    # -- plumbing ------------------------------------------------------------------------------------------

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def _event(self, payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        raw = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(raw):X}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    # -- routes --------------------------------------------------------------------------------------------

    def do_GET(self) -> None:  # http.server's naming
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": TINY_MODEL, "object": "model"}]})
        else:
            self._error(404, f"no route GET {self.path}")

    def do_POST(self) -> None:  # http.server's naming
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/v1/completions":
            self._error(404, f"no route POST {self.path}")
            return
        try:
            request = json.loads(raw)
            model = request.get("model")
            max_tokens = int(request.get("max_tokens", 16))
            prompt = self._prompt_ids(request.get("prompt"))
            if max_tokens < 1:
                raise ValueError("max_tokens must be at least 1")
        except (ValueError, TypeError, AttributeError) as error:
            self._error(400, f"bad request: {error}")
            return
        if model != TINY_MODEL:
            self._error(404, f"the model {model!r} does not exist; this server serves {TINY_MODEL!r}")
            return
        if not request.get("stream"):
            tokens = list(self._generate(prompt, max_tokens))
            text = "".join(f" t{t}" for t in tokens)
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens)}
            self._json(
                200,
                {
                    "object": "text_completion",
                    "model": model,
                    "choices": [{"text": text, "index": 0, "finish_reason": "length"}],
                    "usage": usage,
                },
            )
            return
        options = request.get("stream_options") or {}
        continuous = bool(options.get("continuous_usage_stats")) and self.server.continuous_usage
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        done = 0
        pending: list[int] = []
        for token in self._generate(prompt, max_tokens):
            pending.append(token)
            if len(pending) < self.server.chunk_tokens and done + len(pending) < max_tokens:
                continue
            done += len(pending)
            event: dict[str, Any] = {
                "object": "text_completion",
                "model": model,
                "choices": [
                    {
                        "text": "".join(f" t{t}" for t in pending),
                        "index": 0,
                        "finish_reason": "length" if done == max_tokens else None,
                    }
                ],
            }
            if continuous:
                event["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": done}
            self._event(event)
            pending = []
        if options.get("include_usage"):
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": done,
                "total_tokens": len(prompt) + done,
            }
            self._event({"object": "text_completion", "model": model, "choices": [], "usage": usage})
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- the model -----------------------------------------------------------------------------------------

    def _prompt_ids(self, prompt: Any) -> list[int]:
        vocab = self.server.vocab
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            if not all(0 <= t < vocab for t in prompt):
                raise ValueError(f"token ids must be in [0, {vocab})")
            return prompt
        if isinstance(prompt, str) and prompt.split():
            return [1 + zlib.crc32(word.encode()) % (vocab - 1) for word in prompt.split()]
        raise ValueError("prompt must be a non-empty list of token ids or a non-empty text")

    def _generate(self, prompt: list[int], max_tokens: int) -> Iterator[int]:
        """Greedy tokens, one forward pass each; the KV cache is this request's own (thread-safe)."""
        model = self.server.model
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            for step in range(max_tokens):
                token = out.logits[0, -1].argmax()
                yield int(token)
                if step + 1 < max_tokens:
                    out = model(
                        input_ids=token.view(1, 1), past_key_values=out.past_key_values, use_cache=True
                    )


@contextlib.contextmanager
def serve_tiny(seed: int = 0, chunk_tokens: int = 1, continuous_usage: bool = True) -> Iterator[TinyServer]:
    """The server running in a daemon thread on 127.0.0.1:<free port>; shut down and closed on exit."""
    server = TinyServer(
        ("127.0.0.1", 0), seed=seed, chunk_tokens=chunk_tokens, continuous_usage=continuous_usage
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tiny = TinyServer(("127.0.0.1", args.port), seed=args.seed)
    print(f"serving {TINY_MODEL} on {tiny.url}/v1/completions")
    tiny.serve_forever()
