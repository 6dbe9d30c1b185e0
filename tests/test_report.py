"""propel report for any run, finished or stopped early (issue 60): a header naming the generator, the
solver (simulated or not) and the reference; a banner naming what is missing or interrupted with the
command that finishes it; the probe's held-out metrics beside the training audits' with a verdict; the
reward rule in words; solver attempts and wall time per stage. Drawn by headless Chromium on a run
stopped after probe and on a finished one."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from propel_core.plugins import Registry
from propel_core.records import Label, iter_jsonl
from propel_core.run import start_run
from propel_core.stages import run_stage
from propel_core.stages.report import FEW_ROWS, TRANSFER_DROP, USEFUL_AUC, probe_verdict

pytestmark = pytest.mark.slow

#: the banner's background, a colour nothing else on the page uses
BANNER = (0xFD, 0xEC, 0xEA)


def started(config: dict, folder):
    """A run started as the CLI starts one (its resolved config saved in the folder, the folder held)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.parent / f"{folder.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start_run([path], [], True, Registry.build())


@pytest.fixture(scope="module")
def after_probe(planted_probe, tmp_path_factory):
    """A countdown run stopped after probe: the planted corpus, its activations and its probe (copied
    from the session's planted run, without what the train tests add there), then ``propel report``."""
    folder = tmp_path_factory.mktemp("after-probe") / "stopped-here"
    made_later = ("train", "train.old-*", "eval", "report.html", "timings.json", "refusals.json", "config.yaml")
    shutil.copytree(planted_probe, folder, ignore=shutil.ignore_patterns(*made_later))
    config = {
        "run_dir": str(folder),
        "domain": {"name": "countdown"},
        "generate": {"num_tasks": 128},
        "probe": {"layers": [8], "poolings": ["mean_full"], "architectures": ["linear"]},
        "train": {"steps": 2},
    }
    run = started(config, folder)
    try:
        run_stage(run, "report")
    finally:
        run.release()
    return folder


@pytest.fixture(scope="module")
def finished(planted_probe, tmp_path_factory):
    """A finished arithmetic run on the planted run's probe (reward.main_probe): three GRPO steps, each
    audited by the simulated solver, then evaluate and report, each run as ``propel STAGE`` runs it."""
    folder = tmp_path_factory.mktemp("finished") / "done-run"
    config = {
        "run_dir": str(folder),
        "domain": {"name": "arithmetic"},
        "solver": {"backend": "arithmetic_skill"},
        "generator": {"sampling": {"max_new_tokens": 12}},
        "reward": {"main_probe": str(planted_probe / "probes" / "selected")},
        "train": {
            "steps": 3,
            "group_size": 2,
            "per_device_batch": 4,
            "gradient_accumulation": 1,
            "max_completion_length": 12,
            "gradient_checkpointing": False,
            "audit": {"every": 1, "tasks": 4, "k": 4},
        },
        "checkpoint": {"every": 100},
        "evaluate": {"num_tasks": 6, "k": 4},
    }
    run = started(config, folder)
    try:
        for stage in ("train", "evaluate", "report"):
            run_stage(run, stage)
    finally:
        run.release()
    return folder


def section(page: str, title: str) -> str:
    """The HTML under the heading that starts with ``title``, up to the next heading."""
    return page.split(f"<h2>{title}", 1)[1].split("</h2>", 1)[1].split("<h2>", 1)[0]


def test_a_run_stopped_after_probe_says_what_is_left_and_how_to_finish_it(after_probe):
    page = (after_probe / "report.html").read_text()
    assert "<title>propel report: stopped-here</title>" in page and "<h1>propel report: stopped-here</h1>" in page
    header = page.split("<h1>", 1)[1].split("<h2>", 1)[0]
    assert "<td>solver</td><td>SmolLM2-135M-Instruct (a real model, transformers backend)</td>" in header
    assert "<td>reference (the frozen model the probe reads)</td><td>SmolLM2-135M-Instruct</td>" in header
    banner = page.split("<div class='banner'>", 1)[1].split("</div>", 1)[0]
    config = after_probe / "config.yaml"
    assert re.findall(r"<li><b>(\w+)</b>", banner) == ["train", "evaluate"]  # the corpus stages are whole
    assert f"<code>propel train {config}</code>" in banner and f"<code>propel evaluate {config}</code>" in banner
    # the probe's held-out metrics, and no audit to set them beside: the verdict says which is missing
    trust = section(page, "Can I trust the probe?")
    held_out = json.loads((after_probe / "probes" / "selected" / "probe.json").read_text())["metrics"]
    assert f"{held_out['test_auc']:.3f} (n={int(held_out['test_rows'])})" in trust
    assert "Not checked on the policy&#x27;s own tasks" in trust and "set train.audit.every" in trust
    stages = section(page, "Stages")
    labels = list(iter_jsonl(after_probe / "labels.jsonl", Label))
    attempts = sum(len(label.attempts) for label in labels)
    assert f"<td>label</td><td>{len(labels)} tasks labeled, K=8</td><td class='n'>{attempts}</td>" in stages
    assert "<td>train</td><td>not run</td>" in stages


def test_an_interrupted_stage_is_named_with_the_command_that_goes_on(after_probe, tmp_path):
    """Labels for fewer tasks than are valid, and a training that logged fewer steps than planned with
    no adapter: each is a banner line with its command."""
    from propel_core.stages.report import banner_section, stage_states

    folder = tmp_path / "cut"
    shutil.copytree(after_probe, folder)
    lines = (folder / "labels.jsonl").read_text().splitlines(keepends=True)
    (folder / "labels.jsonl").write_text("".join(lines[:100]))
    (folder / "train").mkdir()
    (folder / "train" / "reward_log.jsonl").write_text('{"step": 0, "rule": "hard"}\n')
    config = {
        "run_dir": str(folder),
        "domain": {"name": "countdown"},
        "generate": {"num_tasks": 128},
        "train": {"steps": 2},
    }
    run = started(config, folder)
    run.release()
    banner = banner_section(stage_states(run))
    assert (
        f"<b>label</b>: 100 of 128 valid tasks labeled &mdash; to finish: <code>propel label {folder}/config.yaml"
        in (banner)
    )
    assert "<b>train</b>: interrupted at step 1 of 2 &mdash; to finish: <code>propel train " in banner


def test_a_finished_run_has_no_banner_and_answers_both_questions(finished):
    page = (finished / "report.html").read_text()
    assert "<div class='banner'>" not in page and "<h1>propel report: done-run</h1>" in page
    header = page.split("<h1>", 1)[1].split("<h2>", 1)[0]
    assert "<td>solver</td><td>arithmetic_skill backend (simulated: no model answers" in header
    # did the probe reward move utility: the evaluation's verdict leads
    assert section(page, "Does it work?").startswith("<p class='verdict'>Against the base generator, trained ")
    # can I trust the probe: held-out AUC beside the audits' AUROC, weighted by the rows each had
    audits = [json.loads(line) for line in (finished / "train" / "audit.jsonl").read_text().splitlines()]
    rows: dict[int, int] = {}
    for label in iter_jsonl(finished / "train" / "audit" / "labels.jsonl", Label):
        if label.utility is not None:
            step = int(label.task_id.split("-")[1])
            rows[step] = rows.get(step, 0) + 1
    measured = [(a["auroc"], rows[a["step"]]) for a in audits if a.get("auroc") is not None]
    trust = section(page, "Can I trust the probe?")
    if measured:
        n = sum(w for _, w in measured)
        assert f"{sum(v * w for v, w in measured) / n:.3f} (n={n})" in trust
        assert ("Trust it:" in trust) != ("Do not trust it:" in trust)
    else:  # every audit's tasks of one class: no AUROC
        assert "Not checked on the policy&#x27;s own tasks" in trust
    # the reward rule in words, with the steps of those planned
    training = section(page, "Training")
    assert "Rewarded by the <code>hard</code> rule at steps 1-3 of 3 planned: R_hard: r_bad if invalid, else the" in (
        training
    )
    assert "{}" not in training.split("</p>", 1)[0]
    # solver attempts and wall time per stage, from the stages' own records and RUN/timings.json
    stages = section(page, "Stages")
    trials = sum(a.get("trials", 0) for a in audits)
    assert f"<td>train</td><td>3 of 3 steps</td><td class='n'>{trials}</td><td><span class='seconds'>" in stages
    evaluated = sum(
        len(label.attempts)
        for arm in ("base", "trained")
        for label in iter_jsonl(finished / "eval" / arm / "labels.jsonl", Label)
    )
    assert f"<td class='n'>{evaluated}</td><td><span class='seconds'>" in stages
    assert "<td>generate</td><td>not needed: the reward reads " in stages
    timings = json.loads((finished / "timings.json").read_text())
    assert {stage: entry["ended"] for stage, entry in timings.items()} == {
        "train": "finished",
        "evaluate": "finished",
        "report": "finished",
    }
    assert timings["train"]["seconds"] > timings["report"]["seconds"] > 0


def test_the_verdict_follows_its_rule():
    """The issue's run (on-policy 0.42 against 0.93 held out) is not trusted, and says why."""
    exploited = probe_verdict(0.93, 0.42, 64, gap=0.35)
    assert exploited.startswith("Do not trust it:") and "the policy is exploiting it: its probability runs +0.35" in (
        exploited
    )
    assert "does not transfer" in probe_verdict(0.93, 0.42, 64, gap=-0.1)
    assert probe_verdict(0.93, 0.93 - TRANSFER_DROP + 0.01, 64, gap=0.0).startswith("Trust it:")
    assert probe_verdict(0.93, 0.93 - TRANSFER_DROP - 0.01, 64, gap=0.0).startswith("Do not trust it:")
    assert probe_verdict(0.65, USEFUL_AUC - 0.01, 64, gap=0.0).startswith("Do not trust it:")
    assert probe_verdict(USEFUL_AUC - 0.01, 0.9, 64, gap=0.0).startswith("Do not trust it: its held-out AUC")
    # small/countdown in issue 60's trial: a held-out AUC of 0.00 on 2 rows a split
    assert probe_verdict(0.0, None, 0, gap=None, held_rows=2).endswith(
        "Measured on 2 held-out rows a split only: label more tasks before reading it."
    )
    assert "held-out rows a split only" not in probe_verdict(0.0, None, 0, gap=None, held_rows=FEW_ROWS)
    assert "too few to tell" in probe_verdict(0.9, 0.9, FEW_ROWS - 1, gap=0.0)
    assert probe_verdict(0.9, None, 0, gap=None).startswith("Not checked on the policy's own tasks")
    assert "no audit ran (set train.audit.every)" in probe_verdict(0.9, None, 0, gap=None)
    assert probe_verdict(None, None, 0, gap=None).startswith("No verdict")


def test_audits_on_one_side_of_the_band_show_their_gap_and_say_why_no_auroc(tmp_path):
    """The trial of issue 60 (small/arithmetic): two audits ran, every audited task out of the band, so
    neither measured an AUROC; the page said "set train.audit.every" (it was set) and showed their
    calibration gap as n/a. It names the audits that ran, why they have no AUROC, and their gap."""
    from propel_core.stages.report import trust_section

    selected = tmp_path / "probes" / "selected"
    selected.mkdir(parents=True)
    (selected / "probe.json").write_text(json.dumps({"metrics": {"test_auc": 0.75, "test_rows": 4}}))
    (tmp_path / "train").mkdir()
    audits = [{"step": step, "utility": 0.0, "auroc": None, "gap": gap} for step, gap in ((0, 0.494), (1, 0.442))]
    (tmp_path / "train" / "audit.jsonl").write_text("".join(json.dumps(a) + "\n" for a in audits))
    trust = trust_section(tmp_path, selected)
    assert "the 2 audits that ran had no tasks on both sides of the band, which an AUROC needs" in trust
    assert "(calibration gap +0.47: the probe&#x27;s probability less the real in-band rate)" in trust
    assert "set train.audit.every" not in trust and "audits at steps 1, 2" in trust
    gap_row = trust.split("calibration gap)</td>", 1)[1].split("</tr>", 1)[0]
    assert "0.468" in gap_row, gap_row


@pytest.mark.parametrize("run", ["after_probe", "finished"])
def test_the_report_renders_in_a_browser(run, request, chromium, tmp_path):
    """Chromium parses the page (its title is the run folder's name) and draws it: a stopped run's
    banner is on the first screen, and a finished run has none."""
    from matplotlib.image import imread

    folder = request.getfixturevalue(run)
    page = folder / "report.html"
    dom = chromium(page, "--dump-dom")
    assert f"<title>propel report: {folder.name}</title>" in dom and "Can I trust the probe?" in dom
    shot = tmp_path / "report.png"
    chromium(page, f"--screenshot={shot}", "--window-size=1000,900")
    pixels = (imread(shot)[:, :, :3] * 255).round()
    banner = (abs(pixels - BANNER) <= 2).all(axis=2).sum()
    assert banner > 20000 if run == "after_probe" else banner == 0, banner
