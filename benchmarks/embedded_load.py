"""Cold vs warm load of the embedded default model, side by side in one run.

Cold: an empty cache, so the GGUF is dequantized and converted to safetensors, then loaded.
Warm: the same cache again. Each load runs in a fresh interpreter, so imports are counted too.

    python benchmarks/embedded_load.py
"""

import os
import subprocess
import sys
import tempfile
import time

LOAD = (
    "from propel_core.config import ModelConfig;"
    "from propel_plugins.backends import TransformersBackend;"
    "TransformersBackend(ModelConfig())"
)


def timed_load(cache: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", LOAD], check=True, capture_output=True, env={**os.environ, "PROPEL_CACHE": cache}
    )
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        cold = timed_load(cache)
        warm = [timed_load(cache) for _ in range(3)]
    print(f"cold load (convert GGUF + load): {cold:6.1f} s")
    print(
        f"warm load (cached safetensors):  {min(warm):6.1f} s (best of 3; all: {', '.join(f'{w:.1f}' for w in warm)})"
    )
    print(f"ratio cold / warm:               {cold / min(warm):6.1f}x")


if __name__ == "__main__":
    main()
