"""extract and probe: pooled activations, probe metrics, the sweep, selection and the bundle."""

import csv
import math

import pytest
import torch

from propel_core.config import ProbeConfig
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.probes import auc, balanced_accuracy, ece, f1, load_probe, spearman, train_probe
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity, read_jsonl
from propel_core.stages.extract import activation_file, load_activations
from propel_core.stages.probe import select, splits

# -- metrics against hand computations ------------------------------------------------------------


def test_balanced_accuracy_and_f1():
    y = torch.tensor([1, 1, 1, 0])
    predicted = torch.tensor([True, False, False, False])
    assert balanced_accuracy(y, predicted) == pytest.approx((1 / 3 + 1) / 2)
    assert f1(y, predicted) == pytest.approx(2 * 1 / (2 * 1 + 0 + 2))


def test_auc_counts_pairs_and_ties():
    y = torch.tensor([1, 1, 0, 0])
    assert auc(y, torch.tensor([0.9, 0.4, 0.4, 0.1])) == pytest.approx((1 + 1 + 0.5 + 1) / 4)
    assert math.isnan(auc(torch.tensor([1, 1]), torch.tensor([0.2, 0.3])))


def test_ece_by_bins():
    y = torch.tensor([1, 0, 1, 1])
    p = torch.tensor([0.95, 0.95, 0.15, 0.15])
    # bin [0.9, 1]: mean p 0.95, accuracy 0.5; bin [0.1, 0.2): mean p 0.15, accuracy 1
    assert ece(y, p) == pytest.approx(0.5 * 0.45 + 0.5 * 0.85)


def test_spearman_with_ties():
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 20, 30, 40])) == pytest.approx(1)
    assert spearman(torch.tensor([1.0, 2, 3]), torch.tensor([3.0, 2, 1])) == pytest.approx(-1)
    assert spearman(torch.tensor([1.0, 1, 2]), torch.tensor([1.0, 2, 3])) == pytest.approx(0.8660254)


# -- splits and selection -------------------------------------------------------------------------


def test_downsample_balances_and_random_split_partitions():
    y = torch.tensor([1] * 10 + [0] * 30)
    ((train, val, test),) = splits(y, ["g"] * 40, "downsample", "random", ProbeConfig(), seed=3)
    rows = torch.cat([train, val, test])
    assert len(rows) == 20 and len(set(rows.tolist())) == 20 and int(y[rows].sum()) == 10
    assert (len(train), len(val), len(test)) == (16, 2, 2)


def test_grouped_folds_never_straddle_groups():
    y = torch.tensor([i % 2 for i in range(60)])
    groups = [f"repo{i % 7}" for i in range(60)]
    folds = list(splits(y, groups, "weighted", "grouped_kfold", ProbeConfig(folds=5), seed=0))
    assert len(folds) == 5
    for train, val, test in folds:
        names = [{groups[i] for i in part.tolist()} for part in (train, val, test)]
        assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
        assert len(train) + len(val) + len(test) == 60
    assert sorted(i for _, _, test in folds for i in test.tolist()) == list(range(60))


def test_selection_respects_calibration_then_rvp():
    cell = lambda bacc, ece_, rvp: {"val_balanced_accuracy": bacc, "val_ece": ece_, "rvp": rvp}  # noqa: E731
    uncalibrated, close_low_rvp, close_high_rvp, far = (
        cell(0.9, 0.4, 9),
        cell(0.70, 0.05, 1),
        cell(0.69, 0.1, 5),
        cell(0.6, 0.05, 50),
    )
    config = ProbeConfig(max_ece=0.15, rvp_tolerance=0.02)
    assert select([uncalibrated, close_low_rvp, close_high_rvp, far], config) is close_high_rvp
    assert select([uncalibrated], config) is uncalibrated  # nothing calibrated: fall back to all


# -- real activations -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, planted_run):
    folder = planted_run(tmp_path_factory.mktemp("probe-run"))
    (folder / "run.yaml").write_text(
        f"run_dir: {folder}\ndomain: {{name: countdown}}\nreference: {{batch_size: 16}}\n"
        "probe: {layers: [2, 8], poolings: [last_token, mean_full], architectures: [linear, mlp], calibrate: true}\n"
    )
    return folder


@pytest.mark.slow
def test_extract_matches_one_text_at_a_time(run_dir, propel_cli, embedded_backend):
    propel_cli("-q", "extract", str(run_dir / "run.yaml"))
    ids, pooled = load_activations(run_dir, 8, "mean_full")
    tasks = {t.id: t for t in read_jsonl(run_dir / "tasks.jsonl", Task)}
    assert ids == list(tasks) and pooled.shape == (128, 576)
    mean_full = Registry.build().get("poolers", "mean_full")
    for row in (0, 57, 127):  # batched with other lengths vs alone: padding must not leak
        alone = embedded_backend.hidden_states([tasks[ids[row]].text], [8], max_length=2048)
        torch.testing.assert_close(pooled[row], mean_full(alone.layers[8], alone.mask)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_extract_reuses_its_cache(run_dir, propel_cli):
    propel_cli("-q", "extract", str(run_dir / "run.yaml"))
    folder = run_dir / "activations"
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.safetensors")}
    propel_cli("-q", "extract", str(run_dir / "run.yaml"), "probe.poolings=[last_token,mean_full,max]")
    after = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.safetensors")}
    assert {name: after[name] for name in stamps} == stamps  # untouched
    assert set(after) - set(stamps) == {activation_file(folder, 2, "max").name, activation_file(folder, 8, "max").name}


@pytest.mark.slow
def test_planted_signal_learned_and_shuffled_labels_not(run_dir, propel_cli):
    propel_cli("-q", "extract", str(run_dir / "run.yaml"))
    _, x = load_activations(run_dir, 8, "mean_full")
    y = torch.tensor([label.utility for label in read_jsonl(run_dir / "labels.jsonl", Label)])
    mlp = Registry.build().get("probe_architectures", "mlp")
    config = ProbeConfig()

    def test_accuracy(labels):
        results = []
        for seed in range(3):
            ((train, val, test),) = splits(labels, ["g"] * len(labels), "downsample", "random", config, seed)
            trained = train_probe(mlp, x, labels, train, val, config, weighted=False, seed=seed)
            results.append(balanced_accuracy(labels[test], trained.logits(x[test]) > 0))
        return sum(results) / len(results)

    assert test_accuracy(y) >= 0.75
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    assert test_accuracy(shuffled) <= 0.65


@pytest.mark.slow
def test_probe_stage_and_bundle_round_trip(run_dir, propel_cli):
    propel_cli("-q", "extract", str(run_dir / "run.yaml"))
    out = propel_cli("-q", "probe", str(run_dir / "run.yaml")).stdout
    assert out.startswith("8 cells; top by validation balanced accuracy:") and "<- selected" in out
    folder = run_dir / "probes"
    with (folder / "sweep.csv").open() as handle:
        cells = list(csv.DictReader(handle))
    assert len(cells) == 8 and {c["pooling"] for c in cells} == {"last_token", "mean_full"}
    assert (folder / "sweep_heatmap.png").stat().st_size > 10_000
    assert max(float(c["test_balanced_accuracy"]) for c in cells) >= 0.75

    scorer = load_probe(folder / "selected")
    bundle = scorer.bundle
    assert (bundle.reference_model, bundle.input_dim) == ("SmolLM2-135M-Instruct", 576)
    assert 0.1 <= bundle.temperature <= 10
    tasks = read_jsonl(run_dir / "tasks.jsonl", Task)[:6]
    scores = scorer.score([task.text for task in tasks])
    _, x = load_activations(run_dir, bundle.layer, bundle.pooling)
    expected = scorer.logits_of_features(x[:6])
    assert [s["logit"] for s in scores] == pytest.approx(expected.tolist(), abs=1e-3)
    (again,) = load_probe(folder / "selected").score([tasks[0].text])  # a fresh load scores the same
    assert again["logit"] == pytest.approx(scores[0]["logit"]) and again["probability"] == pytest.approx(
        scores[0]["probability"]
    )


def test_one_class_is_a_clear_error(tmp_path, propel_cli):
    (tmp_path / "run.yaml").write_text(f"run_dir: {tmp_path}\ndomain: {{name: countdown}}\n")
    label = Label.from_attempts("t0", [SolverAttempt(text="", solved=False)] * 8, (1 / 8, 3 / 8), 1)
    (tmp_path / "labels.jsonl").write_text(label.model_dump_json() + "\n")
    result = propel_cli("probe", str(tmp_path / "run.yaml"), check=False)
    assert result.returncode == 1 and "all 1 labeled tasks are outside the band" in result.stderr


def test_missing_bundle(tmp_path):
    with pytest.raises(PropelError, match="no probe bundle in"):
        load_probe(tmp_path)


@pytest.mark.slow
def test_trajectories_pool_per_turn_then_over_turns(tmp_path, propel_cli, embedded_backend):
    trajectories = {
        "a": ["I will look at the tests first.", "ls tests/", "Now I change the comparison in utils.py to <=."],
        "b": ["Reading the code.", "The bug goes into the parser: an off-by-one in the loop bound."],
        "c": "A single-text task mixed in with trajectories.",
    }
    with JsonlWriter(tmp_path / "tasks.jsonl") as out:
        for task_id, text in trajectories.items():
            out.write(Task(id=task_id, domain="swe", context_id="repo", generation="", payload={}, text=text,
                           validity=Validity.ok(), generator="m"))  # fmt: skip
    (tmp_path / "run.yaml").write_text(
        f"run_dir: {tmp_path}\ndomain: {{name: countdown}}\nreference: {{batch_size: 2}}\n"
        "probe: {layers: [5], poolings: [max, mean_last_half], turn_vector: last_token}\n"
    )
    propel_cli("-q", "extract", str(tmp_path / "run.yaml"))
    poolers = Registry.build().components["poolers"]
    for pooling in ("max", "mean_last_half"):
        ids, pooled = load_activations(tmp_path, 5, pooling)
        assert ids == ["a", "b", "c"]
        for row, text in enumerate(trajectories.values()):
            turns = [text] if isinstance(text, str) else text
            alone = [embedded_backend.hidden_states([turn], [5], max_length=2048) for turn in turns]
            if isinstance(text, str):
                expected = poolers[pooling].obj(alone[0].layers[5], alone[0].mask)[0]
            else:
                vectors = torch.stack([poolers["last_token"].obj(s.layers[5], s.mask)[0] for s in alone])[None]
                expected = poolers[pooling].obj(vectors, torch.ones(1, len(turns), dtype=torch.long))[0]
            torch.testing.assert_close(pooled[row], expected, atol=1e-4, rtol=1e-4)
