"""The openai backend against a real OpenAI-compatible server on loopback, answering with the
embedded model: chat, plain completions, prefill, n samples, concurrency, retries, errors."""

import time
from types import SimpleNamespace

import pytest

from propel_core.backend import was_cut_off
from propel_core.config import ModelConfig, Sampling
from propel_core.errors import PropelError
from propel_core.plugins import Registry

pytestmark = pytest.mark.slow


@pytest.fixture
def server(propel_loopback_server):
    propel_loopback_server.delay, propel_loopback_server.failures, propel_loopback_server.max_choices = 0.2, 0, None
    yield propel_loopback_server
    propel_loopback_server.delay, propel_loopback_server.failures, propel_loopback_server.max_choices = 0.0, 0, None
    propel_loopback_server.retry_after = None


def backend_for(server, **options):
    config = ModelConfig(model="smol", backend="openai", base_url=server.url, max_concurrency=4, **options)
    return Registry.build().backend(config)


SAMPLING = Sampling(temperature=0.0, max_new_tokens=6)


def test_chat_matches_the_model_in_process(server, propel_embedded_backend):
    remote = backend_for(server).generate(["Name a color.", "Count to three."], SAMPLING, n=2)
    local = propel_embedded_backend.generate(["Name a color.", "Count to three."], SAMPLING, n=2)
    assert remote == local and len(remote[0]) == 2


def test_stop_strings_are_sent_and_the_length_limit_is_read_from_finish_reason(server, propel_embedded_backend):
    prompts, longer = (
        ["Write a long story about a lighthouse.", "Hi!"],
        SAMPLING.model_copy(update={"max_new_tokens": 24}),
    )
    remote, stopping = backend_for(server).generate(prompts, longer), longer.stopping_at([" the"])
    assert [was_cut_off(text) for (text,) in remote] == [True, False]
    (stopped,), _ = backend_for(server).generate(prompts, stopping)
    assert server.requests[-1][1]["stop"] == [" the"]
    assert stopped == propel_embedded_backend.generate(prompts[:1], stopping)[0][0] and not was_cut_off(stopped)


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


def test_retries_wait_as_long_as_the_server_asks(server, monkeypatch):
    from propel_plugins import openai_backend as openai_backend_module

    waits = []
    # the backend's own clock only: the loopback server sleeps through the real one
    monkeypatch.setattr(openai_backend_module, "time", SimpleNamespace(sleep=waits.append, time=time.time))
    server.failures, server.retry_after = 2, "7"
    assert len(backend_for(server, max_retries=3).generate(["Hi"], SAMPLING)[0]) == 1
    assert waits == [7.0, 7.0]  # not the 0.5 s, 1 s of the backoff
    server.failures, server.retry_after, waits[:] = 1, "soon", []
    backend_for(server, max_retries=3).generate(["Hi"], SAMPLING)
    assert waits == [0.5]  # an unreadable header: the backoff


def test_retry_after_reads_seconds_and_dates():
    from propel_plugins.openai_backend import MAX_WAIT, retry_after

    assert retry_after("12") == 12.0 and retry_after(None) is None and retry_after("later") is None
    assert retry_after("100000") == MAX_WAIT
    now = 1_700_000_000.0
    assert retry_after("Tue, 14 Nov 2023 22:13:40 GMT", now=now) == pytest.approx(20.0)
    assert retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0  # a date gone by: no wait


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


def test_a_server_that_drops_choices_is_asked_again(server):
    server.max_choices = 1  # a server that ignores n
    before = len(server.requests)
    sampling = Sampling(temperature=0.8, max_new_tokens=6)
    (texts,) = backend_for(server).generate(["Name a color."], sampling, n=3, seed=5)
    assert len(texts) == 3 and len(server.requests) - before == 3
    assert [body["seed"] for _, body, _ in server.requests[before:]] == [5, 6, 7]  # other seeds: other samples
    server.max_choices = 0
    with pytest.raises(PropelError, match="returned no choices"):
        backend_for(server).generate(["Name a color."], sampling, n=2)


def test_without_server_extensions_only_standard_fields_are_sent(server):
    messages = [{"role": "user", "content": "Pick a number."}, {"role": "assistant", "content": "Number:"}]
    sampling = Sampling(temperature=0.7, top_k=20, max_new_tokens=6)
    backend_for(server, server_extensions=False).generate([messages], sampling)
    _, body, _ = server.requests[-1]
    assert not {"top_k", "continue_final_message", "add_generation_prompt"} & set(body)
    assert body["messages"] == [{"role": "user", "content": "Pick a number.\n\nBegin your reply with exactly: Number:"}]
