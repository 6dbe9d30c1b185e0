"""Extraction speed on the embedded model vs a plain transformers forward pass (the peer), in one run.

Compares, over the same texts in the same batches (the extract stage's: sorted by length, the
reference's default batch size), each arm tokenizing its batches itself:
1. peer: plain transformers, the decoder stack alone (``model.base_model``, no LM head, no hidden
   states kept, no pooling);
2. extract at full depth: ``propel_core.probes.activations.pooled_activations`` at the last layer, with the
   ``mean_last_50`` pooler and the turn vector, as the stage runs it; target >= 0.9x the peer's rate;
3. extract truncated at the middle layer L of N; target: cost <= 1.2 x L/N of the full-depth pass.

The texts have the lengths of math tasks the embedded model wrote at the default generator
sampling (temperature 1.0, top-p 0.95, up to 512 new tokens) through the domain's own prompt, parse
and render (``LENGTHS``, recorded from such a run; regenerating them takes ~30 s a task on 2 CPU
cores, ``--generate N`` does it). Their content is real problem text from the math pools, cut to
those token counts: the cost of a forward pass depends on the token counts, not on the words. The
arms are interleaved after a warm-up round (timing.compare).

    python benchmarks/extract.py [--repeats 3] [--generate N]
"""

import argparse

import torch
from timing import compare, ratio, report

from propel_core.config import ModelConfig
from propel_core.execution import job_seed, task_id
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.activations import pooled_activations
from propel_math.pools import BUILTIN_POOLS, builtin_pool

#: tokens of 40 math tasks (``Problem: ...``) the embedded model wrote at the default generator settings
#: (the math domain's prompt, parse and render; all 40 parsed), recorded as ``--generate`` writes them
LENGTHS = [94, 152, 84, 71, 67, 73, 491, 27, 148, 47, 22, 62, 155, 196, 76, 77, 46, 34, 513, 46,
           30, 61, 24, 127, 18, 19, 33, 42, 46, 54, 72, 107, 115, 125, 135, 141, 145, 190, 219, 233]  # fmt: skip


def generated_texts(registry, backend, count: int) -> list[str]:
    """``count`` math tasks written now by the embedded model: default generator sampling, the domain's
    prompt, parse and render; seeded as the generate stage seeds task ``i``."""
    sampling = validate_config({"domain": {"name": "math"}}, registry).generator.sampling
    domain = registry.domain("math")
    contexts = domain.contexts()
    prompts = [domain.generator_prompt(contexts[i * 7 % len(contexts)]) for i in range(count)]
    seeds = [job_seed(0, task_id(i)) for i in range(count)]
    texts = []
    for (generation,) in backend.generate(prompts, sampling, n=1, seed=seeds):
        texts.append(domain.render(domain.parse("Problem:" + generation)))
    return texts


def texts_of_lengths(tokenizer, lengths: list[int]) -> list[str]:
    """Real pool problems, run together and cut to each token count."""
    problems = [f"Problem: {p['problem']}" for name in BUILTIN_POOLS for p in builtin_pool(name)]
    stream = tokenizer("\n\n".join(problems * 4), add_special_tokens=False)["input_ids"]
    texts, start = [], 0
    for length in lengths:
        texts.append(tokenizer.decode(stream[start : start + length]))
        start = (start + 997) % (len(stream) - max(lengths))
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generate", type=int, default=0, help="generate N math tasks now instead of LENGTHS")
    args = parser.parse_args()
    registry = Registry.build()
    reference = ModelConfig()  # the default reference: the embedded model, batch size 8
    backend = registry.backend(reference)
    tokenizer, model, n_layers = backend.tokenizer, backend.model, backend.num_layers
    if args.generate:
        texts = generated_texts(registry, backend, args.generate)
        source = f"{len(texts)} math tasks generated now by the embedded model"
    else:
        texts = texts_of_lengths(tokenizer, LENGTHS)
        source = f"{len(texts)} texts with the token counts of {len(LENGTHS)} generated math tasks"
    order = sorted(texts, key=len)  # as pooled_activations batches them
    batches = [order[i : i + reference.batch_size] for i in range(0, len(order), reference.batch_size)]
    counts = sorted(len(tokenizer(text)["input_ids"]) for text in texts)
    tokens = sum(counts)
    pool = {"mean_last_50": registry.get("poolers", "mean_last_50")}
    turn_vector = registry.get("poolers", "mean_full")

    def bare() -> None:  # the decoder stack alone: the LM head, which extraction never needs, is left out
        tokenizer.padding_side = "right"
        with torch.inference_mode():
            for batch in batches:
                encoded = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=2048)
                model.base_model(**encoded, use_cache=False)

    def extract(layer: int):
        def run() -> None:
            pooled_activations(backend, texts, [layer], pool, turn_vector, 2048, reference.batch_size)

        return run

    middle = n_layers // 2
    peer, full, truncated = (
        "plain transformers forward (peer)",
        f"extract at layer {n_layers}",
        f"extract at layer {middle}",
    )
    times = compare({peer: bare, full: extract(n_layers), truncated: extract(middle)}, repeats=args.repeats, warmup=1)
    print(
        f"{source}: {tokens} tokens, per text min {counts[0]} / median {counts[len(counts) // 2]} / max "
        f"{counts[-1]}; batches of {reference.batch_size}; {torch.get_num_threads()} threads"
    )
    report(
        f"extraction vs a plain forward pass, {n_layers}-layer embedded model",
        times,
        baseline=peer,
        per=(tokens, "tokens"),
    )
    low, mid = ratio(times, peer, full)
    print(f"extract at full depth vs the peer: {low:.2f}x (min), {mid:.2f}x (median) its rate (target >= 0.9x)")
    low, mid = ratio(times, truncated, full)
    share = middle / n_layers
    print(
        f"extract at layer {middle}: cost {low:.2f} (min), {mid:.2f} (median) of full depth; L/N = "
        f"{share:.2f}, target <= {1.2 * share:.2f}"
    )


if __name__ == "__main__":
    main()
