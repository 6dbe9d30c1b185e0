"""Extraction speed on the embedded model, side by side in one run, over the same texts and batches.

1. bare: a plain batched forward pass through all decoder layers (no LM head, no hidden states
   kept, no pooling);
2. extract at full depth: the backend's hidden_states at the last layer + a pooler (what the extract
   stage does per batch); target >= 0.9x the bare pass's throughput;
3. extract truncated at the middle layer L of N; target: cost <= 1.2 x L/N of the full-depth pass.

    python benchmarks/extract.py
"""

import time

import torch

from propel_core.config import ModelConfig
from propel_core.plugins import Registry
from propel_math.pools import BUILTIN_POOLS, builtin_pool

BATCH, REPEATS = 16, 3


def timed(fn) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(REPEATS):
        fn()
    return (time.perf_counter() - start) / REPEATS


def main() -> None:
    registry = Registry.build()
    backend = registry.backend(ModelConfig())
    pool = registry.get("poolers", "mean_last_50")
    texts = sorted((p["problem"] for name in BUILTIN_POOLS for p in builtin_pool(name)), key=len)[:64]
    batches = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    tokenizer, model, n_layers = backend.tokenizer, backend.model, backend.num_layers
    tokenizer.padding_side = "right"
    encoded = [tokenizer(b, return_tensors="pt", padding=True) for b in batches]
    tokens = sum(int(e["attention_mask"].sum()) for e in encoded)

    def bare():  # the decoder stack alone: the LM head, which extraction never needs, is left out
        with torch.inference_mode():
            for e in encoded:
                model.base_model(**e, use_cache=False)

    def extract(layer: int):
        def run():
            for b in batches:
                states = backend.hidden_states(b, [layer], max_length=2048)
                pool(states.layers[layer], states.mask)

        return run

    middle = n_layers // 2
    t_bare, t_full, t_mid = timed(bare), timed(extract(n_layers)), timed(extract(middle))
    print(f"{len(texts)} texts, {tokens} tokens, batches of {BATCH}, {torch.get_num_threads()} threads")
    ratio, cost, share = t_bare / t_full, t_mid / t_full, middle / n_layers
    print(f"bare forward pass, {n_layers} layers: {tokens / t_bare:8.0f} tokens/s")
    print(f"extract at layer {n_layers}:          {tokens / t_full:8.0f} tokens/s  ({ratio:.2f}x bare; target >= 0.9x)")
    print(f"extract at layer {middle}:          {tokens / t_mid:8.0f} tokens/s  (cost {cost:.2f} of full depth;")
    print(f"    L/N = {share:.2f}, target <= {1.2 * share:.2f})")


if __name__ == "__main__":
    main()
