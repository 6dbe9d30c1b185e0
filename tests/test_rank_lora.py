"""The ranker on solver attempts (the ML-engineering RL study): pairs within a task, a LoRA refresh on the reference that
moves held-out pair accuracy on planted pairs, and the calibrated score of the saved bundle, all on
the embedded model and real run files."""

import json
import shutil

import pytest
import torch

from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.bundles import load_probe
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity
from propel_core.run import Run
from propel_core.stages.rank import rank
from propel_core.training.ranking import held_out_split, ordered_pairs, ranking_metrics

pytestmark = pytest.mark.slow

GOOD = """from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

model = make_pipeline(TfidfVectorizer(), LogisticRegression(C={c})).fit(train["{column}"], train["{target}"])
test["{target}"] = model.predict_proba(test["{column}"])[:, 1]"""

BAD = """test["{target}"] = {constant}"""

COMPETITIONS = [
    ("random-acts-of-pizza", "request_text", "requester_received_pizza"),
    ("spooky-author", "text", "is_poe"),
    ("jigsaw-toxic", "comment_text", "toxic"),
    ("quora-insincere", "question_text", "insincere"),
    ("sentiment-movies", "review", "positive"),
    ("fake-news", "title", "fake"),
    ("disaster-tweets", "tweet", "target"),
    ("spam-sms", "message", "spam"),
    ("clickbait", "headline", "clickbait"),
    ("sarcasm", "headline", "is_sarcastic"),
    ("product-reviews", "review_text", "recommended"),
    ("support-tickets", "body", "urgent"),
    ("app-reviews", "content", "helpful"),
    ("hotel-reviews", "review", "satisfied"),
    ("news-category", "short_description", "is_politics"),
    ("essay-scoring", "essay", "high_score"),
    ("code-comments", "comment", "useful"),
    ("job-postings", "description", "fraudulent"),
    ("recipe-reviews", "text", "five_stars"),
    ("question-pairs", "question", "duplicate"),
]


def write_attempts(folder, competitions, good_wins: bool) -> list[str]:
    """tasks.jsonl and labels.jsonl: per competition a TF-IDF + logistic regression solution and a
    constant baseline, the first scored higher when ``good_wins``, and an attempt with no score (no
    valid submission), which is no item. Returns the item texts in the stage's order."""
    texts = []
    with JsonlWriter(folder / "tasks.jsonl") as tasks, JsonlWriter(folder / "labels.jsonl") as labels:
        for k, (name, column, target) in enumerate(competitions):
            text = f"Kaggle {name}: predict {target} from {column}; train and test are loaded."
            task = Task(id=name, domain="mle", context_id=name, generation=text, text=text, validity=Validity.ok(), generator="m")  # fmt: skip
            good = GOOD.format(c=0.5 + k % 4, column=column, target=target)
            bad = BAD.format(constant=[0.5, 0.0, 1.0][k % 3], target=target)
            high, low = (good, bad) if good_wins else (bad, good)
            attempts = [
                SolverAttempt(text=high, solved=True, diagnostics={"verifier_score": 0.62 + 0.01 * k}),
                SolverAttempt(text=low, solved=True, diagnostics={"verifier_score": 0.5 + 0.001 * k}),
                SolverAttempt(text="print('no submission')", solved=False, diagnostics={"verifier_score": None}),
            ]
            tasks.write(task)
            labels.write(Label.from_attempts(task.id, attempts, (1 / 8, 3 / 8), 1))
            texts += [f"{text}\n\n{high}", f"{text}\n\n{low}"]
    return texts


@pytest.fixture(scope="module")
def registry():
    return Registry.build()


def run_in(folder, registry, **rank) -> Run:
    data = {
        "run_dir": str(folder),
        "domain": {"name": "countdown"},
        "lora": {"target_modules": ["q_proj", "v_proj"]},  # the LoRA's targets
        "rank": {"items": "attempts", **rank},
    }
    return Run(validate_config(data, registry), registry, quiet=True)


def test_attempts_are_ranked_within_their_task(tmp_path, registry):
    (tmp_path / "corpus").mkdir()
    texts = write_attempts(tmp_path / "corpus", COMPETITIONS[:10], good_wins=True)
    rank(run_in(tmp_path, registry, labels="corpus/labels.jsonl", held_out=0.3, epochs=40))
    summary = json.loads((tmp_path / "ranker" / "metrics.json").read_text())
    # 10 tasks of two scored attempts: one pair each; a pair across tasks would make many more
    assert summary["count"] == 20 and summary["train_pairs"] + summary["held_out_pairs"] == 10
    assert summary["held_out_pairs"] == 3 and summary["after"]["pair_accuracy"] > 0.5
    scorer = load_probe(tmp_path / "ranker", registry)
    assert scorer.bundle.layer == 15 and scorer.bundle.pooling == "mean_full"  # no probe: the middle layer
    assert scorer.bundle.reference["adapter"] is None and not (tmp_path / "ranker" / "adapter").exists()
    scores = scorer.score(texts)
    line = scorer.bundle.calibration
    assert line["low"] == pytest.approx(min(0.5 + 0.001 * k for k in range(10)), abs=0.01)
    assert all(line["low"] <= s["calibrated"] <= line["high"] for s in scores)
    assert len({round(s["calibrated"], 6) for s in scores}) > 2  # a line, not the clip bounds alone


def test_a_missing_labels_file_is_one_line(tmp_path, registry):
    from propel_core.errors import PropelError

    with pytest.raises(PropelError, match=r"rank\.labels: .*nowhere/labels\.jsonl is not a labels file"):
        rank(run_in(tmp_path, registry, labels="nowhere/labels.jsonl"))


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory, registry):
    """A ranker trained on offline pairs whose planting is the opposite of the on-policy ones (it
    starts wrong on them), then refreshed with a LoRA on the on-policy pairs."""
    folder = tmp_path_factory.mktemp("rank-lora")
    (folder / "offline").mkdir()
    (folder / "on-policy").mkdir()
    write_attempts(folder / "offline", COMPETITIONS[:8], good_wins=False)
    texts = write_attempts(folder / "on-policy", COMPETITIONS[8:], good_wins=True)
    cell = {"layer": 3, "held_out": 0.5}
    rank(run_in(folder, registry, labels="offline/labels.jsonl", epochs=40, **cell))
    run = run_in(
        folder,
        registry,
        labels="on-policy/labels.jsonl",
        refresh=True,
        lora=True,
        lora_lr=1e-3,
        lora_steps=20,
        lora_batch_pairs=2,
        **cell,
    )
    rank(run)
    return run, texts


def test_the_lora_refresh_raises_held_out_pair_accuracy(refreshed):
    run, _ = refreshed
    refresh = json.loads((run.dir / "ranker" / "refresh.json").read_text())
    assert refresh["held_out_pairs"] == 6 and len(refresh["lora_losses"]) == 20
    assert refresh["before"]["pair_accuracy"] < 0.5 < refresh["after"]["pair_accuracy"]
    assert (run.dir / "ranker" / "adapter" / "adapter_config.json").exists()


def test_the_saved_ranker_scores_with_its_adapter_and_calibration(refreshed):
    run, texts = refreshed
    folder = run.dir / "ranker"
    scorer = load_probe(folder, run.registry)
    assert scorer.reference.adapter == str((folder / "adapter").resolve())
    scores = scorer.score(texts)
    line = scorer.bundle.calibration
    assert all(line["low"] <= s["calibrated"] <= line["high"] for s in scores)
    # the loaded ranker (adapter merged) scores what was trained: the held-out metrics come back
    tasks = [text.split(":")[0] for text in texts]
    held_out, _ = held_out_split(tasks, 0.5, run.config.seed, least=1)
    logits = torch.tensor([s["logit"] for s in scores])
    verifier = torch.tensor([0.62 + 0.01 * k if i % 2 == 0 else 0.5 + 0.001 * k for k in range(12) for i in range(2)])
    pairs = ordered_pairs(held_out, verifier.tolist(), 1000, 0, tasks)
    position = {row: i for i, row in enumerate(held_out)}
    local = [(position[i], position[j]) for i, j in pairs]
    again = ranking_metrics(logits[held_out], verifier[held_out], local)
    after = json.loads((folder / "refresh.json").read_text())["after"]
    assert again == pytest.approx(after, abs=1e-6)
    # and without the adapter the same head reads other features
    base = folder.parent / "ranker-without-adapter"
    shutil.copytree(folder, base, ignore=shutil.ignore_patterns("adapter"))
    description = json.loads((base / "probe.json").read_text())
    description["reference"]["adapter"] = None
    (base / "probe.json").write_text(json.dumps(description))
    plain = load_probe(base, run.registry).score(texts)
    assert max(abs(a["logit"] - b["logit"]) for a, b in zip(scores, plain, strict=True)) > 1e-3


def test_a_lora_refresh_goes_on_from_the_saved_adapter(refreshed):
    """Refreshing the LoRA ranker again reads with the adapter it saved: its held-out metrics before
    are the last refresh's after (same labels, same split)."""
    run, _ = refreshed
    last = json.loads((run.dir / "ranker" / "refresh.json").read_text())["after"]
    rank(run_in(run.dir, run.registry, **{**run.config.rank.model_dump(), "lora_steps": 1}))
    again = json.loads((run.dir / "ranker" / "refresh.json").read_text())
    assert again["before"] == pytest.approx(last, abs=1e-6) and len(again["lora_losses"]) == 1
