"""A 48-cell probe sweep (8 layers x 3 poolings x 2 architectures) on 5,000 cached rows.

The activations are synthetic (576-dim, a weak planted signal), written in the extract stage's
format, so this times the probe stage alone; target under 2 minutes on a 2-core machine.

    python benchmarks/probe_sweep.py
"""

import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from propel_core.config import validate_config
from propel_core.plugins import Registry
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity
from propel_core.run import Run
from propel_core.stages.extract import activation_file
from propel_core.stages.probe import probe

ROWS, DIM = 5000, 576
LAYERS, POOLINGS, ARCHITECTURES = (
    [3, 7, 11, 15, 19, 23, 27, 29],
    ["last_token", "mean_full", "mean_last_50"],
    ["linear", "mlp"],
)


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    utility = torch.rand(ROWS, generator=generator) < 0.3
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        with (
            JsonlWriter(run_dir / "tasks.jsonl", fsync=False) as tasks,
            JsonlWriter(run_dir / "labels.jsonl", fsync=False) as labels,
        ):
            for i in range(ROWS):
                task_id = f"t{i:05d}"
                tasks.write(Task(id=task_id, domain="countdown", context_id=f"c{i % 64}", generation="", text="x",
                                 payload={}, validity=Validity.ok(), generator="m"))  # fmt: skip
                solved = 2 if utility[i] else 0
                labels.write(
                    Label.from_attempts(
                        task_id, [SolverAttempt(text="", solved=j < solved) for j in range(8)], (1 / 8, 3 / 8), 1
                    )
                )
        folder = run_dir / "activations"
        folder.mkdir()
        direction = torch.randn(DIM, generator=generator)
        for layer in LAYERS:
            for pooling in POOLINGS:
                x = (
                    torch.randn(ROWS, DIM, generator=generator)
                    + 0.05 * layer / 10 * utility[:, None].float() * direction
                )
                save_file({"x": x.contiguous()}, activation_file(folder, layer, pooling))
        (folder / "index.json").write_text(json.dumps({"task_ids": [f"t{i:05d}" for i in range(ROWS)]}))
        registry = Registry.build()
        config = validate_config({"run_dir": str(run_dir), "domain": {"name": "countdown"},
                                  "probe": {"layers": LAYERS, "poolings": POOLINGS, "architectures": ARCHITECTURES}},
                                 registry)  # fmt: skip
        start = time.perf_counter()
        probe(Run(config, registry, quiet=True))
        elapsed = time.perf_counter() - start
    cells = len(LAYERS) * len(POOLINGS) * len(ARCHITECTURES)
    print(f"{cells}-cell sweep on {ROWS} rows: {elapsed:.1f} s ({elapsed / cells:.2f} s a cell; target < 120 s in all)")


if __name__ == "__main__":
    main()
