"""The CUDA path, measured on a lent GPU machine, with the same workload on this CPU as the baseline.

1. probe agreement: the selected probe's in-band probabilities from a bfloat16 reference against a
   float32 one, on held-out texts: max, 99th-percentile and mean |delta p|, and the share of in-band
   decisions (p >= 0.5) that agree; pooled in float32 (what extract does) and, to show the cause,
   pooled in the reference's own bfloat16 (what it did before);
2. the shared prompt pass in bfloat16: greedy and seeded sampled texts of one prompt pass per distinct
   prompt against one per row, the log-probs of the greedy tokens under both, whether a sampled row
   depends on the rows batched with it, and the speed-up on a label batch (16 tasks x K = 8);
3. two GRPO + LoRA steps of the train stage, rewarded by the probe;
4. throughput: extraction (texts/s), generation (token slots/s) and a GRPO step (s).

The model is the embedded default, SmolLM2-135M-Instruct. Its GGUF (94 MiB) is more than one call of
the device tool carries (64 MiB), so ``prepare`` splits it in two: the first call leaves the first
part on the machine, the second brings the rest and the wheels the device lacks, joins them (the
digest is checked) and measures; the stages load the file through propel's own GGUF conversion.

    python benchmarks/cuda.py prepare                           # here: .gpu/ (git-ignored)
    python benchmarks/cuda.py measure --model M.gguf --out DIR  # on the GPU machine
    python benchmarks/cuda.py measure --device cpu              # the same work here, on the CPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from timing import compare, report

from propel_core.config import Sampling
from propel_core.embedded import GGUF_FILE, _gguf_location, resolve_model
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.activations import pooled_activations
from propel_core.probes.bundles import load_probe
from propel_core.run import Run
from propel_core.stages.extract import extract
from propel_core.stages.probe import probe
from propel_core.stages.train import train
from propel_core.testing import planted_countdown_run

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / ".gpu"
SPLIT = 58 * 2**20  # bytes of the GGUF in the first call
#: what the device's Python lacks (it has torch, transformers, accelerate, peft, pyarrow, pandas, ...)
WHEELS = [
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "omegaconf==2.4.0",
    "antlr4-python3-runtime==4.13.2",
    "gguf==0.19.0",
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def prepare() -> None:
    """The embedded GGUF in two parts with its digest, the wheels the device lacks, and propel's own
    (with the countdown domain)."""
    wheels = KIT / "whl"
    wheels.mkdir(parents=True, exist_ok=True)
    data = _gguf_location().read_bytes()
    (KIT / "first").write_bytes(data[:SPLIT])
    (KIT / "second").write_bytes(data[SPLIT:])
    (KIT / "sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {GGUF_FILE}\n")
    pip = [sys.executable, "-m", "pip"]
    target = [f"--platform={p}" for p in PLATFORMS] + ["--python-version=3.12", "--implementation=cp"]
    download = [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *target]
    subprocess.run([*download, *WHEELS], check=True)
    ours = [str(ROOT), str(ROOT / "domains" / "propel-countdown")]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), *ours], check=True)
    size = sum(p.stat().st_size for p in wheels.iterdir())
    mib = 2**20
    parts = f"first {SPLIT / mib:.0f} MiB, second {(len(data) - SPLIT) / mib:.1f} MiB"
    print(f"{KIT}: {parts}, wheels {size / mib:.1f} MiB")


# -- measurements -------------------------------------------------------------------------------------


class Recorder:
    """A logits processor that keeps each step's log-probs (and changes nothing)."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores.float().log_softmax(-1).cpu())
        return scores


def differences(a: list[float], b: list[float]) -> dict[str, float]:
    gaps = sorted(abs(x - y) for x, y in zip(a, b, strict=True))
    agree = sum((x >= 0.5) == (y >= 0.5) for x, y in zip(a, b, strict=True))
    return {
        "max": gaps[-1],
        "p99": gaps[int(0.99 * (len(gaps) - 1))],
        "mean": statistics.fmean(gaps),
        "decisions_agree": agree / len(gaps),
        "texts": len(gaps),
    }


def probe_agreement(run: Run, registry: Registry, texts: list[str], device: str) -> dict:
    """The selected probe on ``texts`` read by a float32 and a bfloat16 reference on ``device``."""
    scorer = load_probe(run.dir / "probes" / "selected", registry)
    bundle = scorer.bundle
    settings = scorer.reference.model_dump()
    pool = registry.get("poolers", bundle.pooling)
    probabilities = {}
    for dtype in ("float32", "bfloat16"):
        backend = registry.backend(type(scorer.reference)(**{**settings, "device": device, "dtype": dtype}))
        scorer.backend = backend
        probabilities[dtype] = [s["probability"] for s in scorer.score(texts)]
        if dtype == "bfloat16":  # the old way: pooled in bfloat16, then widened
            features = []
            for start in range(0, len(texts), 64):
                states = backend.hidden_states(texts[start : start + 64], [bundle.layer], bundle.max_length)
                features.append(pool(states.layers[bundle.layer], states.mask).float().cpu())
            logits = scorer.logits_of_features(torch.cat(features))
            probabilities["bfloat16 pooled in bfloat16"] = torch.sigmoid(logits).tolist()
    base = probabilities["float32"]
    return {
        "probe": f"layer {bundle.layer}, {bundle.pooling}, {bundle.architecture}",
        "in band share (float32)": sum(p >= 0.5 for p in base) / len(base),
        **{f"{name} vs float32": differences(base, ps) for name, ps in probabilities.items() if name != "float32"},
    }


def shared_prompt_pass(run: Run, registry: Registry, device: str, dtype: str, repeats: int) -> dict:
    """One prompt pass per distinct prompt against one per row, on a label batch: 16 tasks x K = 8."""
    backend = registry.backend(run.config.solver.model_copy(update={"device": device, "dtype": dtype}))
    domain = run.domain()
    payloads = [example for context in domain.contexts()[:8] for example in context.data["examples"]]
    prompts = [domain.solver_prompt(p) for p in payloads]
    texts = [backend.prompt_text(p) for p in prompts for _ in range(8)]
    seeds = [1000 + i for i in range(len(prompts))]
    greedy = Sampling(temperature=0.0, max_new_tokens=48)
    sampled = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=48)
    out: dict = {"dtype": dtype, "rows": len(texts), "prompts": len(prompts)}

    def rows(shared: bool, processors: list):
        backend._share_prefill = shared
        return backend._generate_rows(texts, greedy, processors)

    recorded = {}
    for shared in (True, False):
        recorder = Recorder()
        recorded[shared] = (rows(shared, [recorder]), recorder.steps)
    (a, steps_a), (b, steps_b) = recorded[True], recorded[False]
    out["greedy texts identical"] = sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
    gaps = [(sa - sb).abs().max().item() for sa, sb in zip(steps_a, steps_b, strict=False)]
    out["greedy step-0 log-prob max |delta|"] = gaps[0]
    out["greedy log-prob max |delta| over steps"] = max(gaps)
    completions = {}
    for shared in (True, False):
        backend._share_prefill = shared
        completions[shared] = backend.generate(prompts, sampled, n=8, seed=seeds)
    both = zip(completions[True], completions[False], strict=True)
    pairs = [(x, y) for cx, cy in both for x, y in zip(cx, cy, strict=True)]
    out["sampled texts identical"] = sum(x == y for x, y in pairs) / len(pairs)
    backend._share_prefill = True
    alone = [backend.generate([p], sampled, n=8, seed=[s])[0] for p, s in zip(prompts[:4], seeds, strict=False)]
    pairs = [(x, y) for ca, cb in zip(alone, completions[True], strict=False) for x, y in zip(ca, cb, strict=True)]
    out["sampled rows identical alone vs batched"] = sum(x == y for x, y in pairs) / len(pairs)

    def batch(shared: bool):
        def go():
            backend._share_prefill = shared
            backend.generate(prompts, sampled, n=8, seed=seeds)
            if device.startswith("cuda"):
                torch.cuda.synchronize()

        return go

    times = compare({"one pass per row": batch(False), "shared": batch(True)}, repeats=repeats)
    report(f"label batch {len(prompts)} x 8 on {device} {dtype}", times, "one pass per row", (len(texts) * 48, "slots"))
    out["seconds"] = {name: {"min": min(t), "median": statistics.median(t)} for name, t in times.items()}
    out["speed-up (median)"] = statistics.median(times["one pass per row"]) / statistics.median(times["shared"])
    out["token slots/s (shared, median)"] = len(texts) * 48 / statistics.median(times["shared"])
    backend._share_prefill = True
    return out


def extraction(run: Run, registry: Registry, texts: list[str], device: str, repeats: int) -> dict:
    """Texts per second through ``pooled_activations`` at the middle layer (15 of 30), as extract runs it."""
    poolers = {"mean_full": registry.get("poolers", "mean_full")}
    out = {}
    dtypes = ("float32", "bfloat16") if device.startswith("cuda") else ("float32",)
    arms = {}
    for dtype in dtypes:
        for size in (8, 64):
            model = run.config.reference.model_copy(update={"device": device, "dtype": dtype, "batch_size": size})
            backend = registry.backend(model)

            def go(backend=backend, size=size):
                pooled_activations(backend, texts, [15], poolers, poolers["mean_full"], 2048, size)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()

            arms[f"{dtype} batch {size}"] = go
    times = compare(arms, repeats=repeats)
    report(f"extraction of {len(texts)} texts on {device}", times, None, (len(texts), "texts"))
    for name, seconds in times.items():
        out[name] = {"texts/s (median)": len(texts) / statistics.median(seconds), "min s": min(seconds)}
    return out


def grpo(run: Run) -> dict:
    started = time.perf_counter()
    train(run)
    folder = run.dir / "train"
    steps = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines() if '"step_time"' in line]
    return {
        "stage seconds": time.perf_counter() - started,
        "step seconds": [s["step_time"] for s in steps],
        "rewards": [s["reward"] for s in steps],
        "adapter saved": (folder / "adapter" / "adapter_config.json").exists(),
    }


def measure(args) -> None:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu x{torch.get_num_threads()}",
        "torch": torch.__version__,
    }
    import transformers

    results["transformers"] = transformers.__version__
    model = resolve_model(args.model) if args.model else None
    folder = planted_countdown_run(Path(tempfile.mkdtemp()) / "run", num_contexts=args.tasks // 2)
    registry = Registry.build()
    role = {"model": model, "device": args.device}
    data = {
        "run_dir": str(folder),
        "domain": {"name": "countdown", "options": {"num_contexts": args.tasks // 2}},
        "generator": role,
        "solver": role,
        "reference": {**role, "dtype": "float32", "batch_size": 64 if args.device.startswith("cuda") else 8},
        "probe": {"layers": [4, 8, 15], "poolings": ["mean_full", "last_token"], "architectures": ["linear"]},
        "train": {
            "steps": 2,
            "group_size": 8,
            "per_device_batch": 16,
            "gradient_accumulation": 1,
            "max_completion_length": 64,
        },
        "checkpoint": {"every": 100},
    }
    run = Run(validate_config(data, registry), registry, quiet=True)
    held_out = Registry.build().domain("countdown", num_contexts=args.tasks // 2, seed=99)
    texts = [held_out.render(e) for c in held_out.contexts() for e in c.data["examples"]]

    def section(name: str, work):
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            results[name] = work()
        except Exception:  # one section's failure still leaves the others' numbers
            results[name] = {"error": traceback.format_exc()}
        print(json.dumps(results[name], indent=1), f"({time.perf_counter() - started:.0f} s)", flush=True)
        (out_dir / "cuda.json").write_text(json.dumps(results, indent=1) + "\n")

    def stages():
        extract(run)
        probe(run)
        return json.loads((run.dir / "probes" / "selected" / "probe.json").read_text())

    section("extract + probe stages (float32 reference)", stages)
    if "agreement" in args.sections:
        section("1 probe agreement", lambda: probe_agreement(run, registry, texts, args.device))
    if "prefill" in args.sections:
        for dtype in ("bfloat16", "float32") if args.device.startswith("cuda") else ("float32",):
            work = lambda d=dtype: shared_prompt_pass(run, registry, args.device, d, args.repeats)  # noqa: E731
            section(f"2 shared prompt pass {dtype}", work)
    if "grpo" in args.sections:
        section("3 two GRPO + LoRA steps", lambda: grpo(run))
    if "extraction" in args.sections:
        section("4 extraction throughput", lambda: extraction(run, registry, texts[:512], args.device, args.repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["prepare", "measure"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", help="a .gguf file (default: the embedded model)")
    parser.add_argument("--out", default="cuda-results")
    parser.add_argument("--tasks", type=int, default=2000, help="planted tasks for the probe, and held-out texts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sections", default="agreement,prefill,grpo,extraction")
    args = parser.parse_args()
    prepare() if args.what == "prepare" else measure(args)


if __name__ == "__main__":
    main()
