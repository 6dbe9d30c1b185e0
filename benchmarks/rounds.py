"""Does a solver learn more when the generator and the probe follow it round by round than from a
fixed curriculum? (issue 59; docs/experiment.md, "Rounds")

    .venv/bin/python benchmarks/rounds.py [benchmarks/rounds.yaml] [--out runs/rounds]
        [--arms base,fixed,retrained,rounds]

1. One corpus for every arm: the config's generate, label, extract and probe stages in OUT/corpus;
   the solver's held-out tasks are written apart (OUT/held_out, another seed), so neither the probe
   nor a trace ever sees them, and a round's task that repeats one (spacing and case aside) never
   trains the solver.
2. Each arm is a copy of the corpus folder running ``propel rounds`` with the same seed, so round r
   of every arm draws the same contexts and seeds, and every held-out evaluation is seeded alike:
   - ``base``: the base generator writes every round's tasks and the solver trains on any of them
     (no probe filter): the fixed curriculum of the untrained generator;
   - ``fixed``: one generator trained once against the fixed probe (round 1), the solver on the
     tasks that probe scores in band;
   - ``retrained``: the generator trained every round, against the same fixed probe (as long as
     ``rounds``' training, so the refresh alone tells ``rounds`` from it);
   - ``rounds``: the generator trained every round against the probe refitted from the trained
     solver's labels.
   Every arm labels the same number of tasks a round (the benchmark stops where two arms' attempts
   differ) and trains the solver for the same steps. Round 1 of ``fixed``, ``retrained`` and
   ``rounds`` is one computation (same plan, same seeds): it runs once and is copied.
   The solver-in-the-loop arm (``sil``: ``reward.rule=solver_in_the_loop``, live labels by the
   round's solver) is not run here: its generator steps wait on the solver at every rollout, which
   this CPU cannot fit beside the four arms in the experiment's time.
3. The arms run interleaved, one round of each in turn, and resume where they stopped
   (``rounds.num_rounds`` grows by one per turn). OUT/rounds.json holds every arm's rows and each
   arm's paired comparison with ``base`` per round (same held-out tasks, same attempt seeds);
   OUT/rounds.png the held-out score and the utility per round.
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

from propel_core.evaluation import paired_comparison, rounds_curve

ARMS = {
    "base": ["rounds.generator=base", "rounds.refresh_probe=false", "rounds.in_band_probability=1e-9"],
    "fixed": ["rounds.generator=first_round", "rounds.refresh_probe=false"],
    "retrained": ["rounds.refresh_probe=false"],
    "rounds": [],
}
#: the arms whose round 1 is the same work: the generator trained against the corpus's probe
TRAINED_FIRST = ("fixed", "retrained", "rounds")
#: the held-out tasks' own seed: apart from the corpus's (the config's seed) and every round's
HELD_OUT_SEED = 7
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
    corpus, held_out = out / "corpus", (out / "held_out").resolve()
    print("held-out tasks", flush=True)
    propel("generate", args.config, f"run_dir={held_out}", f"seed={HELD_OUT_SEED}")
    for stage in ("generate", "label", "extract", "probe"):
        print(f"corpus: {stage}", flush=True)
        propel(stage, args.config, f"run_dir={corpus}")
    for arm in arms:
        if not (out / arm).exists():
            shutil.copytree(corpus, out / arm)
    apart = f"rounds.held_out={held_out / 'tasks.jsonl'}"
    for number in range(1, count + 1):  # interleaved: round r of every arm before round r + 1 of any
        for arm in arms:
            print(f"{arm}: round {number}", flush=True)
            if number == 1:
                shared_first_round(out, arm, arms)
            propel("rounds", args.config, f"run_dir={out / arm}", f"rounds.num_rounds={number}", apart, *ARMS[arm])
        spent = {arm: curve(out / arm)[-1]["attempts"] for arm in arms}
        if len(set(spent.values())) > 1:
            raise SystemExit(f"round {number}: the arms spent different solver attempts {spent}; raise rounds.tasks")
    found = {arm: curve(out / arm) for arm in arms}
    against = {arm: versus(out / arm, out / arms[0]) for arm in arms[1:]}
    (out / "rounds.json").write_text(json.dumps({"arms": found, f"vs_{arms[0]}": against}, indent=2) + "\n")
    figure(out / "rounds.png", found)
    print(table(found, against, arms[0]))


def shared_first_round(out: Path, arm: str, arms: list[str]) -> None:
    """Round 1 of the arms that train the generator (``TRAINED_FIRST``) is one computation: the same
    plan and seeds, the same corpus and probe. Where another of them has finished it, it is copied
    into ``arm`` rather than run again (the base solver's held-out score, ``r0``, is the same in every
    arm); an arm that refits the probe runs that step on the copy (its ``round.json`` left out)."""
    done = [
        other for other in arms if other in TRAINED_FIRST and (out / other / "rounds" / "r1" / "round.json").exists()
    ]
    if arm not in TRAINED_FIRST or not done or (out / arm / "rounds").exists():
        return
    source = out / done[0] / "rounds"
    for name in ("r0", "r1"):
        shutil.copytree(source / name, out / arm / "rounds" / name)
    if "rounds.refresh_probe=false" not in ARMS[arm]:
        (out / arm / "rounds" / "r1" / "round.json").unlink()
    print(f"  round 1 copied from {done[0]}: the same plan and seeds", flush=True)


def versus(folder: Path, other: Path) -> list[dict]:
    """Per round, the paired comparison of this arm's solver with ``other``'s on the held-out tasks:
    the same tasks, the same attempt seeds."""
    rows, number = [], 1
    while (mine := folder / "rounds" / f"r{number}" / "held_out.json").exists():
        theirs = other / "rounds" / f"r{number}" / "held_out.json"
        if not theirs.exists():
            break
        ours, base = (json.loads(path.read_text()) for path in (mine, theirs))
        rates = [[count / found["k"] for count in found["counts"]] for found in (ours, base)]
        rows.append({"round": number, **paired_comparison(*rates)})
        number += 1
    return rows


def curve(folder: Path) -> list[dict]:
    """The arm's rows (:func:`propel_core.evaluation.rounds_curve`), its solver attempts counting the
    corpus's labels too."""
    corpus = sum(len(json.loads(line)["attempts"]) for line in (folder / "labels.jsonl").read_text().splitlines())
    return [row | {"attempts": row["attempts"] + corpus} for row in rounds_curve(folder / "rounds")]


def table(found: dict[str, list[dict]], against: dict[str, list[dict]], base: str) -> str:
    def number(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        f"| arm | round | held-out score [95%] | vs {base}, paired [95%] | utility: trained-for / trained solver "
        "| probe AUC | solver tasks | attempts | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, rows in found.items():
        paired = {row["round"]: row for row in against.get(arm, [])}
        for row in rows:
            low, high = row["ci95"]
            shift = "-"
            if row["round"] in paired:
                compared = paired[row["round"]]
                shift = f"{compared['mean_difference']:+.3f} [{compared['ci95'][0]:+.3f}, {compared['ci95'][1]:+.3f}]"
            utility = f"{number(row.get('utility_previous'), 2)} / {number(row.get('utility_trained'), 2)}"
            lines.append(
                f"| {arm} | {row['round']} | {row['score']:.3f} [{low:.3f}, {high:.3f}] | {shift} | {utility} "
                f"| {number(row.get('probe_auc'), 2)} | {row.get('solver_tasks', '-')} | {row['attempts']} "
                f"| {row.get('seconds', '-')} |"
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
        band.plot([row["round"] for row in later], [row["utility_previous"] for row in later], marker="o", label=arm)
    score.set(xlabel="round (0: the base solver)", ylabel="held-out average score", title="The solver")
    band.set(xlabel="round", ylabel="utility for the solver it was trained for", title="The generator's tasks")
    for axes in (score, band):
        axes.legend()
        axes.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
