"""The openai backend against a real OpenAI-compatible server on loopback, answering with the
embedded model: chat, plain completions, prefill, n samples, concurrency, retries, errors."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from propel_core.config import ModelConfig, Sampling
from propel_core.errors import PropelError
from propel_core.plugins import Registry

pytestmark = pytest.mark.slow


class Server:
    """/v1/chat/completions and /v1/completions served by the embedded model; can fail on purpose."""

    def __init__(self, backend):
        self.backend, self.requests, self.failures, self.in_flight, self.most_in_flight = backend, [], 0, 0, 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((self.path, body, self.headers.get("Authorization")))
                    fail = server.failures > 0
                    server.failures -= fail
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    if fail:
                        return self.answer(503, {"error": "busy"})
                    if body.get("model") != "smol":
                        return self.answer(404, {"error": f"model {body.get('model')} is not served"})
                    time.sleep(0.2)  # long enough for concurrent requests to overlap
                    sampling = Sampling(temperature=body["temperature"], top_p=body["top_p"],
                                        top_k=body.get("top_k", 0), max_new_tokens=body["max_tokens"])  # fmt: skip
                    prompt = body.get("messages") or body["prompt"]
                    with server.lock:  # one model, one generation at a time
                        (texts,) = server.backend.generate([prompt], sampling, n=body["n"], seed=body.get("seed"))
                    key = "message" if "messages" in body else "text"
                    choices = [{"index": i, key: {"role": "assistant", "content": t} if key == "message" else t}
                               for i, t in enumerate(texts)]  # fmt: skip
                    self.answer(200, {"choices": list(reversed(choices))})  # order must not matter
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def answer(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def server(embedded_backend):
    server = Server(embedded_backend)
    yield server
    server.http.shutdown()


def backend_for(server, **options):
    config = ModelConfig(model="smol", backend="openai", base_url=server.url, max_concurrency=4, **options)
    return Registry.build().backend(config)


SAMPLING = Sampling(temperature=0.0, max_new_tokens=6)


def test_chat_matches_the_model_in_process(server, embedded_backend):
    remote = backend_for(server).generate(["Name a color.", "Count to three."], SAMPLING, n=2)
    local = embedded_backend.generate(["Name a color.", "Count to three."], SAMPLING, n=2)
    assert remote == local and len(remote[0]) == 2


def test_prefill_asks_the_server_to_continue(server):
    messages = [{"role": "user", "content": "Pick numbers."}, {"role": "assistant", "content": "Target:"}]
    backend_for(server).generate([messages], SAMPLING)
    _, body, _ = server.requests[-1]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"] == messages


def test_plain_completions_and_knobs(server, monkeypatch):
    monkeypatch.setenv("SMOL_KEY", "secret-token")
    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=5)
    (texts,) = backend_for(server, chat_template=False, api_key_env="SMOL_KEY").generate(
        ["Once upon"], sampling, n=3, seed=4
    )
    path, body, auth = server.requests[-1]
    assert path == "/v1/completions" and body["prompt"] == "Once upon" and len(texts) == 3
    assert (body["n"], body["temperature"], body["top_p"], body["top_k"], body["max_tokens"], body["seed"]) == (
        3,
        0.7,
        0.9,
        20,
        5,
        4,
    )
    assert auth == "Bearer secret-token"


def test_requests_run_concurrently(server):
    server.most_in_flight = 0
    backend_for(server).generate([f"Say {i}." for i in range(4)], SAMPLING)
    assert server.most_in_flight >= 2


def test_retries_server_errors(server):
    server.failures = 2
    assert len(backend_for(server, max_retries=3).generate(["Hi"], SAMPLING)[0]) == 1
    assert server.failures == 0


def test_gives_up_with_the_servers_message(server):
    server.failures = 5
    with pytest.raises(PropelError, match=r"answered 503: .*busy"):
        backend_for(server, max_retries=1).generate(["Hi"], SAMPLING)
    server.failures = 0
    wrong = Registry.build().backend(ModelConfig(model="other", backend="openai", base_url=server.url))
    with pytest.raises(PropelError, match=r"answered 404: .*model other is not served"):
        wrong.generate(["Hi"], SAMPLING)


def test_no_hidden_states_and_clear_config_errors(server):
    with pytest.raises(PropelError, match="returns text, not hidden states"):
        backend_for(server).hidden_states(["x"], [1], 8)
    with pytest.raises(PropelError, match="needs base_url"):
        Registry.build().backend(ModelConfig(model="smol", backend="openai"))
    with pytest.raises(PropelError, match="cannot reach"):
        Registry.build().backend(
            ModelConfig(model="smol", backend="openai", base_url="http://127.0.0.1:9/v1", max_retries=0)
        ).generate(["x"], SAMPLING)
