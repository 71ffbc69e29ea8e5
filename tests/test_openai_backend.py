"""The openai backend's failure handling and concurrency, against tiny local HTTP servers.

The servers here answer with canned status codes and bodies to reproduce network failures; the
backend's work on a real model is tested against a real vLLM server in test_vllm_server.py.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from udpo.env.backends import BackendError, ChatRequest, SamplingParams
from udpo.env.backends.openai import OpenAIBackend
from udpo.env.backends.vllm_server import free_port

ASK = [{"role": "user", "content": "hello"}]


def chat_answer(content: str) -> dict:
    """A chat completion as an OpenAI server (no vLLM extras) writes it."""
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "length",
                "logprobs": {"content": [{"token": "a", "logprob": -0.5, "top_logprobs": []},
                                         {"token": "b", "logprob": -1.25, "top_logprobs": []}]},
            }
        ],
    }  # fmt: skip


class FakeServer:
    """A threaded HTTP server whose handler is ``respond(path, body) -> (status, body, headers)``."""

    def __init__(self, respond):
        self.respond = respond
        self.calls: list[tuple[str, dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                with outer.lock:
                    outer.calls.append((self.path, body))
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    status, answer, headers = outer.respond(self.path, body)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1
                data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            do_GET = do_POST = _serve

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def backend(url: str, **options) -> OpenAIBackend:
    defaults = {"model": "m", "max_retries": 2, "backoff": 0.01, "timeout": 5.0, "vllm_extras": False}
    return OpenAIBackend(base_url=url, **{**defaults, **options})


def test_no_server_names_the_url_after_retries():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BackendError) as err:
        backend(url).generate([ChatRequest(ASK)])
    assert f"{url}/chat/completions" in str(err.value)
    assert "after 3 attempt(s)" in str(err.value) and "ConnectError" in str(err.value)


def test_server_error_is_retried_then_reported():
    def respond(path, body):
        return 500, {"error": {"message": "engine exploded"}}, {}

    with FakeServer(respond) as server:
        with pytest.raises(BackendError, match=r"failed after 3 attempt\(s\): HTTP 500: engine exploded"):
            backend(server.url).generate([ChatRequest(ASK)])
        assert len(server.calls) == 3


def test_rate_limit_then_success_and_plain_server_answers():
    def respond(path, body):
        if len(server.calls) == 1:
            return 429, "slow down", {"retry-after": "0.05"}
        return 200, chat_answer(f"echo {body['messages'][0]['content']}"), {}

    with FakeServer(respond) as server:
        (c,) = backend(server.url).generate([ChatRequest(ASK, SamplingParams(max_tokens=2, seed=4))])
    assert len(server.calls) == 2
    path, sent = server.calls[-1]
    assert path == "/v1/chat/completions"
    assert sent["model"] == "m" and sent["max_tokens"] == 2 and sent["seed"] == 4 and sent["logprobs"] is True
    assert "return_token_ids" not in sent  # not a vLLM server: no extensions asked for
    # a server without token ids: text and log-probs come back, ids are empty
    assert c.text == "echo hello" and c.logprobs == [-0.5, -1.25] and c.finish_reason == "length"
    assert c.prompt_ids == [] and c.completion_ids == []


def test_client_error_fails_at_once():
    def respond(path, body):
        return 400, {"error": {"message": "max_tokens is too large"}}, {}

    with FakeServer(respond) as server:
        with pytest.raises(BackendError, match="HTTP 400: max_tokens is too large"):
            backend(server.url).generate([ChatRequest(ASK)])
        assert len(server.calls) == 1


def test_timeout_is_retried_then_reported():
    def respond(path, body):
        time.sleep(1.0)
        return 200, chat_answer("late"), {}

    with FakeServer(respond) as server:
        with pytest.raises(BackendError, match=r"after 2 attempt\(s\): no answer within the 0.2s timeout"):
            backend(server.url, timeout=0.2, max_retries=1).generate([ChatRequest(ASK)])
        assert len(server.calls) == 2


def test_concurrency_limit_and_order():
    def respond(path, body):
        time.sleep(0.1)
        return 200, chat_answer(body["messages"][0]["content"]), {}

    requests = [ChatRequest([{"role": "user", "content": f"q{k}"}], SamplingParams(seed=7)) for k in range(8)]
    with FakeServer(respond) as server:
        out = backend(server.url, max_concurrency=3).generate(requests)
    assert [c.text for c in out] == [f"q{k}" for k in range(8)]
    assert server.max_in_flight == 3
    assert sorted(body["seed"] for _, body in server.calls) == list(range(7, 15))


def test_model_discovery_and_adapter_loading_hint():
    def respond(path, body):
        if path == "/v1/models":
            return (
                200,
                {"data": [{"id": "base-model", "parent": None}, {"id": "agent0", "parent": "base-model"}]},
                {},
            )
        if path == "/version":
            return 200, {"version": "0.32.0"}, {}
        return 404, {"detail": "Not Found"}, {}

    with FakeServer(respond) as server:
        remote = OpenAIBackend(base_url=server.url, max_retries=0)
        assert remote.model == "base-model" and remote.adapters == ["agent0"] and remote.is_vllm
        with pytest.raises(BackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            remote.load_adapter("agent1", "/tmp/agent1")
