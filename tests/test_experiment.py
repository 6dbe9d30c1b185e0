"""The frontier-shift experiment's machinery on a tiny run: arithmetic tasks from hand-written
generations, labeled through the label stage's code by the simulated ``arithmetic_skill`` solver,
reward logs written by the real reward scorer, then the summary, its figures and the report (also
rendered in headless Chromium where it is installed). The experiment itself is a benchmark."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from propel_core.domain import make_task
from propel_core.execution import label_tasks, task_id
from propel_core.plans import validate_config
from propel_core.records import JsonlWriter, Label, Task, iter_jsonl
from propel_core.run import Run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))  # the experiment is a benchmark
from experiment import ARMS, FILE, figures, summarize

K = 8
SEEDS = [0, 1]
#: each arm's generation from contexts 0..5 ("Compute:" is the prompt's prefill)
WRITES = {
    "base": ["3 + 4", "5 + 6", "hello", "7 + 1", "2 + 2", "9 - 3"],  # easy: mostly solved 8 of 8
    "hard": ["23 * 45", "31 * 17", "23 * 45", "2 + 2", "64 / 16 * 3", "hello"],  # products: often in band
    "wco": ["23 * 45", "5 + 6", "31 * 17 - 4", "7 + 1", "48 / 12", "12 * 13"],
    "sil": ["3 + 4", "31 * 17", "nonsense", "19 * 21", "2 + 2", "88 - 12 * 3"],
}


def _run(registry, folder, seed: int = 0, **sections) -> Run:
    data = {
        "run_dir": str(folder),
        "seed": seed,
        "domain": {"name": "arithmetic"},
        "solver": {"backend": "arithmetic_skill"},
        "label": {"k": K},
    } | sections
    return Run(validate_config(data, registry), registry, quiet=True)


def _tasks(run: Run, generations: list[str]) -> list[Task]:
    domain = run.domain()
    predicates = run.registry.validity_predicates(domain)
    contexts = domain.contexts()
    return [
        make_task(task_id(i), domain, contexts[i], f"Compute: {text}", "m", predicates)
        for i, text in enumerate(generations)
    ]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """A run folder holding a labeled corpus and every arm of two RL seeds, evaluated."""
    from propel_core.execution import solver_labels
    from propel_core.plugins import Registry
    from propel_core.training.generator_reward import reward_scorer

    registry = Registry.build()
    folder = tmp_path_factory.mktemp("frontier")
    run = _run(registry, folder)
    root = folder / "experiment"
    corpus = _tasks(run, WRITES["base"] + WRITES["hard"])
    with JsonlWriter(folder / "tasks.jsonl") as out:
        for task in corpus:
            out.write(task)
    valid = [task for task in corpus if task.validity.valid]
    label_tasks(run.services, valid, folder / "labels.jsonl", run.plans.label)
    for seed in SEEDS:
        evaluation = _run(registry, folder, seed=1000 + seed)
        for arm in ARMS:
            tasks = _tasks(evaluation, WRITES[arm])
            where = root / "eval" / f"seed-{seed}" / arm
            with JsonlWriter(where / "tasks.jsonl") as out:
                for task in tasks:
                    out.write(task)
            valid = [task for task in tasks if task.validity.valid]
            label_tasks(evaluation.services, valid, where / "labels.jsonl", replace(run.plans.label, seed=1000 + seed))
            # a probe that scores every in-band task +1 and every other labeled task -1
            labeled = list(iter_jsonl(where / "labels.jsonl", Label))
            logits = {label.task_id: 1.0 if label.utility else -1.0 for label in labeled}
            (where / "probe_logits.json").write_text(json.dumps(logits))
        # the sil arm's rewards come from live solver runs, counted in its reward log
        sil = _run(
            registry,
            folder,
            seed=seed,
            reward={"rule": "solver_in_the_loop"},
            train={"group_size": 2, "per_device_batch": 2},
        )
        (root / "sil" / f"seed-{seed}").mkdir(parents=True)
        solve = solver_labels(sil.services, replace(sil.plans.label, seed=seed))
        log_path = root / "sil" / f"seed-{seed}" / "reward_log.jsonl"
        scorer = reward_scorer(
            sil.services, sil.config.reward, sil.config.train, folder / "probes", solve, log_path=log_path
        )
        prompt = sil.domain().generator_prompt(sil.domain().contexts()[0])
        for completions in ([" 23 * 45", " 3 + 4"], [" 12 * 13", " oops"]):
            scorer([prompt] * 2, [[{"role": "assistant", "content": text}] for text in completions])
        for arm, rewards in (("hard", [-1.0, 0.5]), ("wco", [-2.0, -0.5])):
            where = root / arm / f"seed-{seed}"
            where.mkdir(parents=True)
            entries = [
                {
                    "step": step,
                    "reward_mean": reward,
                    "reward_std": 1.0,
                    "validity_rate": 0.75,
                    "degenerate_groups": 0.0,
                }
                for step, reward in enumerate(rewards)
            ]
            (where / "reward_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
            kl = [{"step": step + 1, "kl": 0.01 * (step + 1) * (seed + 1)} for step in range(2)]
            (where / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kl))
    timings = {
        "corpus": {"generate": 10.0, "label": 5.0},
        "train": {arm: {"0": 100.0, "1": 120.0} for arm in ("hard", "wco", "sil")},
        "eval": {},
    }
    setting = {"domain": "arithmetic", "seeds": SEEDS, "eval_tasks_per_seed": len(WRITES["base"]), "k": K}
    summary = summarize(root, SEEDS, K, setting, timings)
    (root / FILE).write_text(json.dumps(summary))
    return run, root, summary


def _utility(root, seed: int, arm: str) -> list[float]:
    """Per context: 1.0 where the arm's task is valid and its label in band, read from the files."""
    where = root / "eval" / f"seed-{seed}" / arm
    in_band = {label.task_id for label in list(iter_jsonl(where / "labels.jsonl", Label)) if label.utility == 1}
    tasks = sorted(list(iter_jsonl(where / "tasks.jsonl", Task)), key=lambda task: task.id)
    return [float(task.validity.valid and task.id in in_band) for task in tasks]


def test_each_arm_is_summed_up_from_its_own_files(experiment):
    import statistics

    _, root, summary = experiment
    assert list(summary["arms"]) == list(ARMS)
    for arm, values in summary["arms"].items():
        per_seed = [statistics.fmean(_utility(root, seed, arm)) for seed in SEEDS]
        assert values["utility"]["per_seed"] == pytest.approx(per_seed)
        assert values["utility"]["mean"] == pytest.approx(statistics.fmean(per_seed))
        assert values["utility"]["se"] == pytest.approx(statistics.stdev(per_seed) / 2**0.5)
        assert values["generations_per_seed"] == [6, 6]
        labels = [
            label
            for seed in SEEDS
            for label in list(iter_jsonl(root / "eval" / f"seed-{seed}" / arm / "labels.jsonl", Label))
        ]
        solved = [sum(bool(a.solved) for a in label.attempts) for label in labels]
        assert values["solve_counts"] == [solved.count(count) for count in range(K + 1)]
        found = values["probe_on_tasks"]
        assert found["rows"] == len(labels)  # pooled over the seeds
        assert found["in_band_rate"] == pytest.approx(sum(label.utility for label in labels) / len(labels))
        if 0 < sum(label.utility for label in labels) < len(labels):
            assert found["auc"] == 1.0 and found["balanced_accuracy"] == 1.0
    hard = [sum(_utility(root, seed, "hard")) for seed in SEEDS]
    base = [sum(_utility(root, seed, "base")) for seed in SEEDS]
    assert sum(hard) > sum(base)  # products land in the 1..3-of-8 band, single-digit sums do not


def test_solver_trials_are_counted_where_they_are_spent(experiment):
    _, root, summary = experiment
    corpus = list(iter_jsonl(root.parent / "labels.jsonl", Label))
    offline = sum(len(label.attempts) for label in corpus)
    assert offline == K * len(corpus) > 0
    trials = {arm: values["solver_trials"] for arm, values in summary["arms"].items()}
    assert trials["base"] == {"offline": 0, "online_per_seed": 0, "total": 0}
    assert trials["hard"] == trials["wco"] == {"offline": offline, "online_per_seed": 0, "total": offline}
    # sil's two reward calls per seed saw three valid tasks ("23 * 45", "3 + 4", "12 * 13"): K attempts each
    assert trials["sil"] == {"offline": 0, "online_per_seed": 3 * K, "total": 3 * K}
    walls = {arm: values["wall_seconds"]["total"] for arm, values in summary["arms"].items()}
    assert walls == {"base": 0.0, "hard": 15.0 + 110.0, "wco": 15.0 + 110.0, "sil": 110.0}


def test_each_trained_arm_is_compared_with_base_over_seeds_and_contexts(experiment):
    import statistics

    from propel_core.evaluation import paired_comparison

    _, root, summary = experiment
    for arm in ("hard", "wco", "sil"):
        ours = [u for seed in SEEDS for u in _utility(root, seed, arm)]
        base = [u for seed in SEEDS for u in _utility(root, seed, "base")]
        found = summary["arms"][arm]["vs_base"]
        assert found["mean_difference"] == pytest.approx(statistics.fmean(ours) - statistics.fmean(base))
        assert found == paired_comparison(ours, base, groups=[0] * 6 + [1] * 6)
        assert found["groups"] == 2 and found["ci95"][0] <= found["mean_difference"] <= found["ci95"][1]
        assert f"{arm} " in summary["verdict"]
    assert "vs_base" not in summary["arms"]["base"]


def test_training_curves_join_the_kl_of_the_same_step(experiment):
    _, _, summary = experiment
    curve = summary["arms"]["hard"]["training"]
    assert [row["step"] for row in curve] == [0, 1]
    assert curve[0]["reward_mean"] == pytest.approx(-1.0) and curve[1]["reward_mean"] == pytest.approx(0.5)
    assert curve[0]["kl"] == pytest.approx((0.01 + 0.02) / 2) and curve[1]["kl"] == pytest.approx((0.02 + 0.04) / 2)
    assert summary["arms"]["sil"]["training"][0]["kl"] is None  # no TRL log: no KL, not a made-up one
    assert "training" not in summary["arms"]["base"]


def test_arms_that_do_not_pair_up_with_base_are_refused(experiment, tmp_path):
    _, root, _ = experiment
    copy = tmp_path / "run" / "experiment"
    shutil.copytree(root, copy)
    tasks = copy / "eval" / "seed-0" / "hard" / "tasks.jsonl"
    tasks.write_text("".join(tasks.read_text().splitlines(keepends=True)[:-1]))  # one task short
    with pytest.raises(ValueError, match="the hard arm's evaluation tasks are not base's"):
        summarize(copy, SEEDS, K, {}, {})


def test_timings_resume_add_up_and_refuse_another_config(tmp_path):
    """A finished piece is skipped on a rerun; an interrupted one keeps its seconds for the rerun
    that finishes it; a rerun with another config is refused with the keys that differ."""
    import time

    from experiment import Timings

    from propel_core.errors import PropelError

    path = tmp_path / "timings.json"
    timings = Timings(path, {"train": {"steps": 30}})
    timings.run(("corpus", "generate"), lambda: time.sleep(0.05))
    ran = []
    timings.run(("corpus", "generate"), lambda: ran.append(1))
    assert not ran and timings.data["corpus"]["generate"] >= 0.05

    def interrupted():
        time.sleep(0.05)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        timings.run(("train", "hard", "0"), interrupted)
    again = Timings(path, {"train": {"steps": 30}})  # read back from the file
    assert again.data["partial"]["train/hard/0"] >= 0.05 and "train" not in again.data
    again.run(("train", "hard", "0"), lambda: None)
    assert again.data["train"]["hard"]["0"] >= 0.05 and not again.data["partial"]
    assert not path.with_suffix(".tmp").exists()
    with pytest.raises(PropelError, match=r"made with other settings \(train.steps: 30 -> 50\)"):
        Timings(path, {"train": {"steps": 50}})


def test_a_missing_evaluation_names_the_arm_and_seed(experiment, tmp_path):
    _, root, _ = experiment
    copy = tmp_path / "run" / "experiment"
    shutil.copytree(root, copy)
    shutil.rmtree(copy / "eval" / "seed-1" / "wco")
    with pytest.raises(FileNotFoundError, match="the wco arm of seed 1 was not evaluated"):
        summarize(copy, SEEDS, K, {}, {})


def test_a_run_of_some_arms_is_summed_up_from_base_and_those(experiment, tmp_path):
    """``--arms hard``: the other arms' files are not needed, and hard's figures are those of the
    whole experiment's."""
    run, root, summary = experiment
    copy = tmp_path / "run" / "experiment"
    shutil.copytree(root, copy)
    for arm in ("wco", "sil"):
        shutil.rmtree(copy / arm)
        for seed in SEEDS:
            shutil.rmtree(copy / "eval" / f"seed-{seed}" / arm)
    some = summarize(copy, SEEDS, K, {"seeds": SEEDS}, {}, trained=("hard",))
    assert list(some["arms"]) == ["base", "hard"]
    assert some["arms"]["hard"]["vs_base"] == summary["arms"]["hard"]["vs_base"]
    assert "wco" not in some["verdict"] and "hard " in some["verdict"]
    assert set(figures(some, tmp_path, run.config.label)) == {"utility", "curves", "solve_counts"}


def test_one_seed_is_judged_by_the_bootstrap_and_still_reported(experiment, tmp_path):
    import html

    from propel_core.stages.report import experiment_section

    run, root, _ = experiment
    setting = {"seeds": [0], "eval_tasks_per_seed": len(WRITES["base"])}
    summary = summarize(root, [0], K, setting, {})
    assert all(not arm["vs_base"].get("seed_t95") for arm in summary["arms"].values() if "vs_base" in arm)
    assert "95% paired bootstrap" in summary["verdict"] and "t-interval" not in summary["verdict"]
    figures(summary, tmp_path, run.config.label)
    section = experiment_section(summary, tmp_path)
    assert html.escape(summary["verdict"], quote=False) in section


@pytest.fixture(scope="module")
def page(experiment):
    from propel_core.stages.report import report

    run, root, summary = experiment
    paths = figures(summary, root, run.config.label)
    assert all(path.read_bytes().startswith(b"\x89PNG") for path in paths.values())
    report(run)
    return run.dir / "report.html"


def test_the_report_leads_with_the_answer_and_folds_the_config(page):
    text = page.read_text()
    verdict = text.index("class='verdict'>Against the base generator, ")
    assert verdict < text.index("<h2>Probe quality") < text.index("<h2>Data funnel") < text.index("<h2>Configuration")
    assert "<details><summary>" in text[text.index("<h2>Configuration") :]
    assert "over 2 seeds x 6 contexts" in text
    # three figures of the experiment, each embedded
    assert text.count("src='data:image/png;base64,") == 3 and "src='http" not in text
    # the probe was scored on a handful of rows per arm: the page says so, as markup, not as escaped text
    assert "<span class='few'>(only " in text and "rows: too few to tell)</span>" in text
    assert "&lt;span" not in text


def test_the_report_renders_in_a_browser_with_the_figure_on_the_first_screen(page, tmp_path, chromium):
    """Chromium draws the page: the utility bars (a colour nothing else on the page uses) appear
    within its first 1,200 pixels."""
    from matplotlib.image import imread

    shot = tmp_path / "report.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1000,1200")
    pixels = imread(shot)[:, :, :3]
    assert pixels.shape[:2] == (1200, 1000)
    bars = (
        (abs(pixels[:, :, 0] - 72 / 255) < 0.03)
        & (abs(pixels[:, :, 1] - 120 / 255) < 0.03)
        & (abs(pixels[:, :, 2] - 168 / 255) < 0.03)
    )
    assert bars.sum() > 2000  # the bars of four arms, not a stray pixel
