"""The transformers backend on the real embedded model."""

import pytest
import torch

from propel_core.backend import was_cut_off
from propel_core.config import Sampling
from propel_core.embedded import EMBEDDED_MODEL_ID, embedded_model_path
from propel_core.errors import PropelError

pytestmark = pytest.mark.slow


def test_embedded_cache_is_plain_safetensors(propel_embedded_backend):
    folder = embedded_model_path()
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert propel_embedded_backend.model_id == EMBEDDED_MODEL_ID
    assert propel_embedded_backend.num_layers == 30
    assert propel_embedded_backend.model.config.hidden_size == 576


def test_chat_template_applied(propel_embedded_backend):
    text = propel_embedded_backend.prompt_text("Hello")
    assert "<|im_start|>user\nHello<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_assistant_prefill_is_continued(propel_embedded_backend):
    messages = [{"role": "user", "content": "Pick numbers."}, {"role": "assistant", "content": "Numbers:"}]
    assert propel_embedded_backend.prompt_text(messages).endswith("<|im_start|>assistant\nNumbers:")


def test_k_samples_per_prompt_reproducible(propel_embedded_backend):
    sampling = Sampling(temperature=0.9, top_p=0.95, top_k=20, max_new_tokens=8)
    prompts = ["Name a color.", [{"role": "user", "content": "Name an animal."}], "Count to three."]
    first = propel_embedded_backend.generate(prompts, n=3, sampling=sampling, seed=7)
    assert [len(group) for group in first] == [3, 3, 3]
    assert propel_embedded_backend.generate(prompts, n=3, sampling=sampling, seed=7) == first
    assert len({text for group in first for text in group}) > 3  # sampling, not one greedy answer


def test_a_completion_depends_on_its_own_seed_not_on_the_batch(propel_embedded_backend):
    """Each prompt draws from its own stream (seed[i]): alone or beside others, it samples the same."""
    sampling = Sampling(temperature=1.0, top_p=0.9, top_k=30, max_new_tokens=10)
    together = propel_embedded_backend.generate(
        ["Name a color.", "Count to three.", "Name a fish."], sampling, n=2, seed=[11, 12, 13]
    )
    alone = [
        propel_embedded_backend.generate([prompt], sampling, n=2, seed=[seed])[0]
        for prompt, seed in (("Name a color.", 11), ("Count to three.", 12), ("Name a fish.", 13))
    ]
    assert together == alone
    assert propel_embedded_backend.generate(["Name a color."], sampling, n=2, seed=[99])[0] != together[0]


def test_greedy_when_temperature_zero(propel_embedded_backend):
    greedy = Sampling(temperature=0.0, max_new_tokens=6)
    one = propel_embedded_backend.generate(["What is 2+2?"], n=2, sampling=greedy, seed=1)
    two = propel_embedded_backend.generate(["What is 2+2?"], n=1, sampling=greedy, seed=2)
    assert one[0][0] == one[0][1] == two[0][0]


def test_attempts_at_one_prompt_share_its_prompt_pass(propel_embedded_backend, monkeypatch):
    """K rows of one prompt (n=K, or the same prompt K times as batched turns send it) run the prompt
    once, and (in float32) sample exactly what K separate prompt passes sample: the same seeds give the
    same texts."""
    sampling = Sampling(temperature=0.8, top_p=0.95, top_k=20, max_new_tokens=8)
    prompts = ["Name a color.", "Count to three, slowly please."]
    passes = []
    hook = propel_embedded_backend.model.base_model.register_forward_hook(
        lambda _module, _args, kwargs, _out: passes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        shared = propel_embedded_backend.generate(prompts, sampling, n=3, seed=[5, 40])
    finally:
        hook.remove()
    length = propel_embedded_backend.tokenizer([propel_embedded_backend.prompt_text(prompts[1])], return_tensors="pt")
    assert passes[0] == (2, length["input_ids"].shape[1] - 1)  # the distinct prompts, all but the last token
    assert passes[1] == (6, 1) and all(shape == (6, 1) for shape in passes[1:])  # then per row, one token at a time
    as_turns = propel_embedded_backend.generate(
        [prompts[0]] * 3 + [prompts[1]] * 3, sampling, seed=[5, 6, 7, 40, 41, 42]
    )
    assert [text for (text,) in as_turns] == shared[0] + shared[1]
    assert propel_embedded_backend.generate(prompts[1:], sampling, n=3, seed=[40]) == shared[1:]  # alone, the same
    monkeypatch.setattr(propel_embedded_backend, "_share_prefill", False)  # every row runs its own prompt pass
    assert propel_embedded_backend.generate(prompts, sampling, n=3, seed=[5, 40]) == shared


def test_greedy_rows_of_one_prompt_share_its_prompt_pass(propel_embedded_backend, monkeypatch):
    greedy = Sampling(temperature=0.0, max_new_tokens=8)
    prompts = ["What is 2+2?", "Name a color.", "What is 2+2?"]
    shared = propel_embedded_backend.generate(prompts, greedy, n=2)
    assert shared[0] == shared[2] == [propel_embedded_backend.generate(prompts[:1], greedy)[0][0]] * 2
    monkeypatch.setattr(propel_embedded_backend, "_share_prefill", False)
    assert propel_embedded_backend.generate(prompts, greedy, n=2) == shared


def test_half_precision_runs_a_prompt_pass_per_row():
    """In bfloat16 the K attempts at a task do not share a prompt pass: its other matrix shapes round
    otherwise, and on an H100 31% of greedy rows changed when they shared (benchmarks/cuda.py)."""
    from propel_core.config import ModelConfig
    from propel_plugins.backends import TransformersBackend

    backend = TransformersBackend(ModelConfig(dtype="bfloat16", device="cpu"))
    rows = []
    hook = backend.model.base_model.register_forward_hook(
        lambda _module, _args, kwargs, _out: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        backend.generate(["Name a color."], Sampling(temperature=0.8, max_new_tokens=2), n=3, seed=[5])
    finally:
        hook.remove()
    assert not backend._share_prefill and rows[0] == 3  # the first pass is the whole prompt, once per row


def test_hidden_states_match_full_forward(propel_embedded_backend):
    texts = ["A longer task statement with several more tokens in it.", "Short one."]
    states = propel_embedded_backend.hidden_states(texts, [0, 5, 11], max_length=64)
    tok = propel_embedded_backend.tokenizer
    tok.padding_side = "right"
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        full = propel_embedded_backend.model(**batch, output_hidden_states=True).hidden_states
    real = states.mask.bool()
    assert real.sum(1).tolist() == batch["attention_mask"].sum(1).tolist()
    for layer in (0, 5, 11):
        torch.testing.assert_close(states.layers[layer][real], full[layer][real], atol=1e-4, rtol=1e-4)


def test_blocks_above_deepest_layer_do_not_run(propel_embedded_backend):
    calls = []
    blocks = propel_embedded_backend.model.base_model.layers
    handles = [blocks[i].register_forward_hook(lambda *a, i=i: calls.append(i)) for i in range(len(blocks))]
    try:
        propel_embedded_backend.hidden_states(["one task"], [3, 7], max_length=16)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == list(range(7))
    assert len(propel_embedded_backend.model.base_model.layers) == 30  # restored


def test_max_length_truncates(propel_embedded_backend):
    states = propel_embedded_backend.hidden_states(["word " * 100], [1], max_length=10)
    assert states.layers[1].shape[1] == 10


def test_layer_out_of_range(propel_embedded_backend):
    with pytest.raises(PropelError, match=r"layers \[31\] out of range .* layers 0..30"):
        propel_embedded_backend.hidden_states(["x"], [31], max_length=8)


def test_local_folder_loads_like_a_hub_id(propel_embedded_backend):
    from propel_core.config import ModelConfig
    from propel_plugins.backends import TransformersBackend

    local = TransformersBackend(ModelConfig(model=str(embedded_model_path())))
    assert local.model_id == str(embedded_model_path())
    greedy = Sampling(temperature=0.0, max_new_tokens=5)
    assert local.generate(["Hi"], sampling=greedy) == propel_embedded_backend.generate(["Hi"], sampling=greedy)


def test_hidden_states_and_generation_from_two_threads_equal_serial(propel_embedded_backend):
    """The audit's solver calls and the probe's reward may share one backend from two threads: the
    reward's truncated pass cuts the model's blocks and hooks them while it runs, and each call pads
    its own side, so neither may see the other's state."""
    from concurrent.futures import ThreadPoolExecutor

    backend, greedy = propel_embedded_backend, Sampling(temperature=0.0, max_new_tokens=6)
    texts, prompts = ["Compute: 23 * 45", "A much longer task statement, with more tokens."], ["Name a color."]
    states = backend.hidden_states(texts, [4], max_length=64).layers[4]
    written = backend.generate(prompts, greedy)
    with ThreadPoolExecutor(2) as pool:
        reads = [pool.submit(backend.hidden_states, texts, [4], 64) for _ in range(3)]
        writes = [pool.submit(backend.generate, prompts, greedy) for _ in range(3)]
        for read in reads:
            torch.testing.assert_close(read.result().layers[4], states)
        assert all(write.result() == written for write in writes)


def test_a_completion_says_whether_the_length_limit_cut_it_off(propel_embedded_backend):
    """The limit cuts a long answer; the model ends a short one itself (its end token), and a stop
    string ends one where the model first writes it, left out of the text: neither is cut off."""
    prompts = ["Write a long story about a lighthouse keeper.", "Hi!"]
    cut, whole = propel_embedded_backend.generate(prompts, Sampling(temperature=0.0, max_new_tokens=24))
    assert was_cut_off(cut[0]) and not was_cut_off(whole[0])
    stopped = propel_embedded_backend.generate(
        [prompts[0]], Sampling(temperature=0.8, max_new_tokens=64, stop=[" the", "."]), n=4, seed=1
    )[0]
    free = propel_embedded_backend.generate([prompts[0]], Sampling(temperature=0.8, max_new_tokens=64), n=4, seed=1)[0]
    for short, long in zip(stopped, free, strict=True):  # the same rows, stopped at the first stop string
        assert not was_cut_off(short) and " the" not in short and "." not in short
        assert long.startswith(short) and long[len(short) :].startswith((" the", "."))
