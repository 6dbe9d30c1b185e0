"""The vllm backend. Its generation path needs vLLM and a CUDA GPU, which this machine lacks."""

import importlib.util

import pytest

from propel_core.config import ModelConfig
from propel_core.errors import PropelError
from propel_core.plugins import Registry

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; this checks the message when it is not")
def test_missing_vllm_is_a_clear_error():
    with pytest.raises(PropelError, match=r"needs vLLM: pip install 'propel-core\[vllm\]'"):
        Registry.build().backend(ModelConfig(backend="vllm"))


@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM and a CUDA GPU (pip install 'propel-core[vllm]')")
def test_k_samples_per_prompt_with_prefill():
    from propel_core.config import Sampling

    backend = Registry.build().backend(ModelConfig(backend="vllm"))
    prompts = [
        "Name a color.",
        [{"role": "user", "content": "Pick numbers."}, {"role": "assistant", "content": "Target:"}],
    ]
    out = backend.generate(prompts, Sampling(temperature=0.9, max_new_tokens=8), n=4, seed=0)
    assert [len(group) for group in out] == [4, 4]
    with pytest.raises(PropelError, match="not per-layer hidden states"):
        backend.hidden_states(["x"], [1], 8)
