"""Cold vs warm load of the embedded default model, each next to plain transformers (the peer).

Compares, each load in a fresh interpreter (imports counted), started in a new session, all alike:
  cold: propel with an empty cache (the GGUF is dequantized, converted to safetensors, then loaded),
        vs plain transformers loading the same GGUF file directly (``from_pretrained(gguf_file=...)``);
  warm: propel with the cache filled (``TransformersBackend(ModelConfig())``), vs plain transformers
        loading the cached safetensors folder (``AutoTokenizer`` + ``AutoModelForCausalLM``).
One untimed propel load fills the warm cache, one untimed round of all four warms up; then the arms
are interleaved (timing.compare).

    python benchmarks/embedded_load.py [--repeats 3]
"""

import argparse
import os
import subprocess
import sys
import tempfile

from timing import compare, ratio, report

from propel_core.embedded import EMBEDDED_MODEL_ID, GGUF_FILE, _gguf_location

PROPEL = (
    "from propel_core.config import ModelConfig;"
    "from propel_plugins.backends import TransformersBackend;"
    "TransformersBackend(ModelConfig())"
)
PLAIN = (
    "import sys, torch;"
    "from transformers import AutoModelForCausalLM, AutoTokenizer;"
    "path, gguf = sys.argv[1], sys.argv[2] or None;"
    "AutoTokenizer.from_pretrained(path, gguf_file=gguf);"
    "AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf, dtype=torch.float32)"
)


def load(code: str, cache: str, *argv: str) -> None:
    subprocess.run(
        [sys.executable, "-c", code, *argv],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PROPEL_CACHE": cache},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    gguf = _gguf_location()
    with tempfile.TemporaryDirectory() as warm_cache:
        folder = os.path.join(warm_cache, EMBEDDED_MODEL_ID)

        def cold() -> None:
            with tempfile.TemporaryDirectory() as empty:
                load(PROPEL, empty)

        arms = {
            "cold, plain transformers from the GGUF (peer)": lambda: load(
                PLAIN, warm_cache, str(gguf.parent), GGUF_FILE
            ),
            "cold, propel (convert GGUF + load)": cold,
            "warm, plain transformers from the cached folder (peer)": lambda: load(PLAIN, warm_cache, folder, ""),
            "warm, propel (cached safetensors)": lambda: load(PROPEL, warm_cache),
        }
        load(PROPEL, warm_cache)  # fills the warm cache: the first round below needs it
        times = compare(arms, repeats=args.repeats, warmup=1)
    names = list(arms)
    report(f"load of the embedded model ({GGUF_FILE}), a fresh interpreter each", times)
    for peer, ours in ((names[0], names[1]), (names[2], names[3])):
        low, mid = ratio(times, ours, peer)
        print(f"  {ours}: {low:.2f}x the peer's time (min), {mid:.2f}x (median)")
    low, mid = ratio(times, names[1], names[3])
    print(f"  cold / warm (propel): {low:.1f}x (min), {mid:.1f}x (median)")


if __name__ == "__main__":
    main()
