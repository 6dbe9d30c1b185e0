"""K=8 solver attempts per task: one batched call per task batch vs one sample at a time, same tasks.

Target: batched at least 3x faster. Same model, prompts, sampling and token budget, one run.

    python benchmarks/label.py
"""

import time

from propel_core.config import ModelConfig, Sampling
from propel_core.plugins import Registry

K = 8
SAMPLING = Sampling(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=48)
PUZZLES = [{"numbers": [3, 8, 8], "target": 24}, {"numbers": [2, 3, 5], "target": 10},
           {"numbers": [4, 3, 1], "target": 12}, {"numbers": [5, 6, 2], "target": 30}]  # fmt: skip


def main() -> None:
    registry = Registry.build()
    backend = registry.backend(ModelConfig(batch_size=4))
    domain = registry.domain("countdown")
    prompts = [domain.solver_prompt(p) for p in PUZZLES]
    backend.generate(prompts[:1], SAMPLING, n=1, seed=0)  # warm-up

    start = time.perf_counter()
    batched = backend.generate(prompts, SAMPLING, n=K, seed=0)
    t_batched = time.perf_counter() - start

    start = time.perf_counter()
    single = [[backend.generate([p], SAMPLING, n=1, seed=i)[0][0] for i in range(K)] for p in prompts]
    t_single = time.perf_counter() - start

    assert [len(a) for a in batched] == [len(a) for a in single] == [K] * len(PUZZLES)
    attempts = K * len(PUZZLES)
    print(f"{len(PUZZLES)} tasks x K={K} attempts, up to {SAMPLING.max_new_tokens} new tokens each")
    print(f"one batched call:    {t_batched:6.1f} s  ({attempts / t_batched:.2f} attempts/s)")
    print(f"one sample at a time: {t_single:6.1f} s  ({attempts / t_single:.2f} attempts/s)")
    print(f"speed-up: {t_single / t_batched:.1f}x (target >= 3x)")


if __name__ == "__main__":
    main()
