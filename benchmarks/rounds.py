"""Does a solver learn more when the generator and the probe follow it round by round than from a
fixed curriculum? (issue 59; docs/experiment.md, "Rounds")

    .venv/bin/python benchmarks/rounds.py [benchmarks/rounds.yaml] [--out runs/rounds] [--arms base,fixed,rounds]

1. One corpus for every arm: the config's generate, label, extract and probe stages in OUT/corpus.
2. Each arm is a copy of that folder running ``propel rounds`` with the same seed, so every arm's
   round r draws the same contexts and seeds and scores its solver on the same held-out tasks (the
   first ``rounds.held_out_tasks`` valid tasks of the corpus, which no arm trains on):
   - ``base``: the base generator writes every round's tasks (``rounds.generator=base``, the first
     probe throughout): a fixed curriculum of the untrained generator;
   - ``fixed``: one generator trained once against the fixed probe (``first_round``, no refresh);
   - ``rounds``: the generator retrained every round against the probe refitted from the trained
     solver's labels.
   Every arm spends the same solver attempts by construction: the same corpus, a labeled sample
   twice a round, the same solver training rollouts and held-out evaluation.
   The solver-in-the-loop arm (``sil``, a live solver reward for every generator rollout) is left out:
   it would spend ``label.k`` solver attempts per generator rollout, more than each round's budget.
3. The arms run interleaved, one round of each in turn, and resume where they stopped
   (``rounds.num_rounds`` grows by one per turn). OUT/rounds.json and OUT/rounds.png hold the
   held-out score per round with its 95% interval, the in-band rates, and the attempts spent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from propel_core.evaluation import rounds_curve

ARMS = {
    "base": ["rounds.generator=base", "rounds.refresh_probe=false"],
    "fixed": ["rounds.generator=first_round", "rounds.refresh_probe=false"],
    "rounds": [],
}
PROPEL = str(Path(sys.executable).with_name("propel"))


def propel(*args: str) -> None:
    started = time.monotonic()
    subprocess.run([PROPEL, "-q", *args], check=True)
    print(f"  propel {args[0]}: {time.monotonic() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(Path(__file__).with_name("rounds.yaml")))
    parser.add_argument("--out", default="runs/rounds")
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args()
    out, arms = Path(args.out), args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    count = yaml.safe_load(Path(args.config).read_text())["rounds"]["num_rounds"]
    corpus = out / "corpus"
    for stage in ("generate", "label", "extract", "probe"):
        print(f"corpus: {stage}", flush=True)
        propel(stage, args.config, f"run_dir={corpus}")
    for arm in arms:
        if not (out / arm).exists():
            shutil.copytree(corpus, out / arm)
    for number in range(1, count + 1):  # interleaved: round r of every arm before round r + 1 of any
        for arm in arms:
            print(f"{arm}: round {number}", flush=True)
            propel("rounds", args.config, f"run_dir={out / arm}", f"rounds.num_rounds={number}", *ARMS[arm])
    found = {arm: curve(out / arm) for arm in arms}
    (out / "rounds.json").write_text(json.dumps(found, indent=2) + "\n")
    figure(out / "rounds.png", found)
    print(table(found))


def curve(folder: Path) -> list[dict]:
    """The arm's rows (:func:`propel_core.evaluation.rounds_curve`), its solver attempts counting the
    corpus's labels too."""
    corpus = sum(len(json.loads(line)["attempts"]) for line in (folder / "labels.jsonl").read_text().splitlines())
    return [row | {"attempts": row["attempts"] + corpus} for row in rounds_curve(folder / "rounds")]


def table(found: dict[str, list[dict]]) -> str:
    def number(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "| arm | round | held-out score [95%] | vs base solver [95%] | in band: trained / previous solver "
        "| probe AUC | attempts | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, rows in found.items():
        for row in rows:
            low, high = row["ci95"]
            versus = "-"
            if "vs_base" in row:
                versus = f"{row['vs_base']:+.3f} [{row['vs_base_ci95'][0]:+.3f}, {row['vs_base_ci95'][1]:+.3f}]"
            rates = f"{number(row.get('in_band_trained'), 2)} / {number(row.get('in_band_previous'), 2)}"
            lines.append(
                f"| {arm} | {row['round']} | {row['score']:.3f} [{low:.3f}, {high:.3f}] | {versus} | {rates} "
                f"| {number(row.get('probe_auc'), 2)} | {row['attempts']} | {row.get('seconds', '-')} |"
            )
    return "\n".join(lines)


def figure(path: Path, found: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (score, band) = plt.subplots(1, 2, figsize=(10, 4))
    for shift, (arm, rows) in enumerate(found.items()):
        x = [row["round"] + 0.08 * (shift - 1) for row in rows]
        y = [row["score"] for row in rows]
        errors = [[row["score"] - row["ci95"][0] for row in rows], [row["ci95"][1] - row["score"] for row in rows]]
        score.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=arm)
        later = rows[1:]
        band.plot([row["round"] for row in later], [row["in_band_trained"] for row in later], marker="o", label=arm)
    score.set(xlabel="round (0: the base solver)", ylabel="held-out average score", title="The solver")
    band.set(xlabel="round", ylabel="in band for the trained solver", title="The generator's tasks")
    for axes in (score, band):
        axes.legend()
        axes.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
