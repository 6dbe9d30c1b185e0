"""Seconds per rollout of the MLE domain's two scorers on the same rollouts: the verifier (a sandboxed
execution of the script, then scoring its submission against the held-out labels) vs the reward
model (a calibrated Bradley-Terry ranker on the embedded reference model's features, as RM-GRPO's
model steps score), the ML-engineering RL study's motivation for RM-GRPO (there: 2.7 s -> 64 s of execution per rollout
as validity rose).

The rollouts are scripts of the kinds a policy writes on its way to validity, each on three shipped
tasks (iris accuracy, breast_cancer auc, digits accuracy): one that crashes right after importing,
one that trains and writes a malformed submission, a valid logistic regression, a valid 200-tree
random forest. The verifier grades them one at a time (as one executor worker does); the reward model
scores them as one batch (as a GRPO step does). The ranker is trained first by the rank stage on
those same scripts with their verified scores (its quality is not measured here: scoring costs the
same). Arms interleaved after a warm-up (timing.compare); the verifier's cost is also printed per
kind of script, valid ones last. No external peer: the verifier is the cost the reward model saves.

    python benchmarks/mle_cost.py [--repeats 3]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import compare, ratio, report

from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.bundles import load_probe
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity
from propel_core.run import Run
from propel_core.stages.rank import rank
from propel_mle.plugin import TASKS, solution

CRASH = "import numpy as np\nimport pandas as pd\nraise RuntimeError('not finished')\n"


def scripts(payload: dict) -> dict[str, str]:
    forest = solution(payload, "forest")
    malformed = forest.replace('{"id": test["id"], "target"', '{"row": test["id"], "label"')
    return {
        "crash after imports": CRASH,
        "malformed submission": malformed,
        "valid, linear": solution(payload, "linear"),
        "valid, forest": forest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    registry = Registry.build()
    domain = registry.domain("mle")
    tasks = []
    for i in (0, 2, 3):
        payload = TASKS[i]
        text = domain.render(payload)
        tasks.append(
            Task(
                id=f"mle-{i:03d}",
                domain="mle",
                context_id="c",
                generation=text,
                generator="shipped",
                payload=payload,
                text=text,
                topic=domain.topic(payload),
                validity=Validity.ok(),
            )
        )
    rollouts = [(task, kind, f"```python\n{code}```") for task in tasks for kind, code in scripts(task.payload).items()]

    folder = Path(tempfile.mkdtemp(prefix="mle-cost-"))
    print(f"verifying {len(rollouts)} rollouts once, to train the ranker on their scores ...")
    verdicts = [domain.grade(task.payload, text) for task, _, text in rollouts]
    with JsonlWriter(folder / "corpus" / "tasks.jsonl") as out:
        for task in tasks:
            out.write(task)
    with JsonlWriter(folder / "corpus" / "labels.jsonl") as out:
        for task in tasks:
            attempts = [
                SolverAttempt(text=text, solved=verdict.solved, diagnostics=verdict.diagnostics)
                for (owner, _, text), verdict in zip(rollouts, verdicts, strict=True)
                if owner is task
            ]
            out.write(Label.from_attempts(task.id, attempts, (0.1, 0.9), 1))
    config = {
        "run_dir": str(folder),
        "domain": {"name": "mle"},
        "rank": {"items": "attempts", "labels": "corpus/labels.jsonl"},
    }
    rank(Run(validate_config(config, registry), registry, quiet=True))
    ranker = load_probe(folder / "ranker", registry)
    texts = [f"{task.text}\n\n{text}" for task, _, text in rollouts]

    per_kind: dict[str, list[float]] = {}

    def verifier() -> None:
        for task, kind, text in rollouts:
            started = time.perf_counter()
            domain.grade(task.payload, text)
            per_kind.setdefault(kind, []).append(time.perf_counter() - started)

    def reward_model() -> None:
        ranker.score(texts)

    times = compare(
        {"verifier (execute + score)": verifier, "reward model (one batch)": reward_model}, repeats=args.repeats
    )
    count = len(rollouts)
    report(
        f"scoring {count} MLE rollouts (3 tasks x 4 kinds of script), seconds per call",
        times,
        baseline="verifier (execute + score)",
        per=(count, "rollouts"),
    )
    print("verifier seconds per rollout, by kind of script (min / median over every timed and warm-up call):")
    for kind, seconds in per_kind.items():
        print(f"  {kind:22s} {min(seconds):6.2f} / {statistics.median(seconds):6.2f}")
    fast, typical = ratio(times, "verifier (execute + score)", "reward model (one batch)")
    verifier_each = statistics.median(times["verifier (execute + score)"]) / count
    model_each = statistics.median(times["reward model (one batch)"]) / count
    print(
        f"per rollout (medians): verifier {verifier_each:.2f} s, reward model {model_each:.3f} s: "
        f"the reward model is {fast:.0f}x (min) / {typical:.0f}x (median) cheaper"
    )


if __name__ == "__main__":
    main()
