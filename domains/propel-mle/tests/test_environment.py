"""Real sandboxed runs of hand-written solutions: the markers each reaches, the verifier's score, and
what a hostile solution gets (nothing it did not earn)."""

import pytest

from propel_core.domain import grade_attempt
from propel_core.records import Task, Validity
from propel_mle.datasets import split
from propel_mle.environment import IN_PROCESS, MARKERS
from propel_mle.plugin import TASKS, solution
from propel_plugins.rewards import partial_instrumentation

IRIS = TASKS[0]  # accuracy, 3 classes
CANCER_AUC = TASKS[2]
DIABETES = TASKS[4]  # rmse


@pytest.fixture(scope="module")
def mle():
    from propel_core.plugins import Registry

    domain = Registry.build().domain("mle", time_limit=30.0)
    if not domain.sandbox.isolated:
        pytest.skip("the MLE environment runs solutions only with every isolation layer")
    return domain


def grade(mle, payload, code):
    return mle.grade(payload, f"```python\n{code}\n```")


def reward(verdict, rule=partial_instrumentation):
    from propel_core.config import RewardConfig

    score = verdict.diagnostics["verifier_score"]
    task = Task(
        id="t",
        domain="mle",
        context_id="",
        generation="",
        generator="",
        validity=Validity.ok() if score is not None else Validity.reject("invalid"),
    )
    return rule(RewardConfig())(task, {"markers": len(verdict.diagnostics["markers"]), "verifier_score": score})


def test_a_crash_right_after_importing_reaches_one_marker(mle):
    verdict = grade(mle, IRIS, "import numpy as np\nraise RuntimeError('gave up')")
    assert verdict.diagnostics["markers"] == ["imports"]
    assert verdict.solved is False and verdict.diagnostics["verifier_score"] is None
    assert "RuntimeError: gave up" in verdict.reason
    assert reward(verdict) == pytest.approx(-10 + 0.1 * 1)
    assert verdict.diagnostics["duration"] > 0


MALFORMED = """
import pandas as pd
from sklearn.linear_model import LogisticRegression
train = pd.read_csv("train.csv")
test = pd.read_csv("test.csv")
features = [c for c in train.columns if c != "target"]
model = LogisticRegression(max_iter=500).fit(train[features], train["target"])
pd.DataFrame({"row": test["id"], "label": model.predict(test[features])}).to_csv("submission.csv", index=False)
"""


def test_a_malformed_submission_keeps_its_markers_and_gets_no_score(mle):
    verdict = grade(mle, IRIS, MALFORMED)
    assert verdict.diagnostics["markers"] == [*IN_PROCESS, "submission written"]
    assert verdict.diagnostics["verifier_score"] is None and verdict.solved is False
    assert "header must be 'id,target'" in verdict.reason
    assert reward(verdict) == pytest.approx(-10 + 0.1 * 6)


@pytest.mark.parametrize(
    "bad, problem",
    [
        ('sub["target"] = 7', "not one of the classes"),  # no such class
        ('sub["target"] = float("inf")', "predicts 'inf'"),
        ('sub["target"] = float("nan")', "is not an id and a number"),  # pandas writes NaN as nothing
        ("sub = sub.iloc[1:]", "1 test ids missing"),
        ("sub = pd.concat([sub, sub.iloc[:1]])", "appears twice"),
    ],
)
def test_each_schema_break_is_named(mle, bad, problem):
    code = MALFORMED.replace(
        'pd.DataFrame({"row": test["id"], "label": model.predict(test[features])}).to_csv("submission.csv", index=False)',
        f'sub = pd.DataFrame({{"id": test["id"], "target": model.predict(test[features])}})\n{bad}\n'
        'sub.to_csv("submission.csv", index=False)',
    )
    verdict = grade(mle, IRIS, code)
    assert problem in verdict.reason and verdict.diagnostics["verifier_score"] is None
    assert "schema valid" not in verdict.diagnostics["markers"]


@pytest.mark.parametrize("payload", [IRIS, CANCER_AUC, DIABETES], ids=lambda p: f"{p['dataset']}-{p['metric']}")
def test_a_correct_solution_gets_its_held_out_metric(mle, payload):
    """The peer: the same model fitted here with plain scikit-learn, scored on the held-out labels."""
    from sklearn import metrics
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    verdict = grade(mle, payload, solution(payload))
    assert verdict.diagnostics["markers"] == list(MARKERS)
    parts = split(payload["dataset"], "target", mle.secret)
    features = [c for c in parts.train.columns if c != "target"]
    regression = payload["metric"] == "rmse"
    model = (RandomForestRegressor if regression else RandomForestClassifier)(n_estimators=200, random_state=0)
    model.fit(parts.train[features], parts.train["target"])
    if payload["metric"] == "auc":
        expected = metrics.roc_auc_score(parts.labels, model.predict_proba(parts.test[features])[:, 1])
    elif regression:
        rmse = metrics.root_mean_squared_error(parts.labels, model.predict(parts.test[features]))
        assert verdict.diagnostics["metric_value"] == pytest.approx(rmse)
        expected = 1 - rmse / pytest.importorskip("numpy").std(parts.labels)
    else:
        expected = metrics.accuracy_score(parts.labels, model.predict(parts.test[features]))
    assert verdict.diagnostics["verifier_score"] == pytest.approx(expected)
    assert verdict.solved is bool(expected >= payload["bar"])
    assert reward(verdict) == pytest.approx(expected)  # a valid submission earns its score


# Recomputes which iris rows are held out, their ids and their classes (iris is stored sorted by
# class, 50 each): with the domain's secret this would be a perfect submission (checked below).
RECOMPUTE = """
import hashlib
import numpy as np
import pandas as pd
seed = int.from_bytes(hashlib.sha256("{secret}/iris".encode()).digest()[:8], "big")
rng = np.random.default_rng(seed)
order = rng.permutation(150)
ids = rng.choice(1_000_000, size=38, replace=False)
pd.DataFrame({{"id": ids, "target": order[:38] // 50}}).to_csv("submission.csv", index=False)
"""

# Each tries to reach the held-out labels another way; none may score, and each would score
# perfectly if the labels (or the secret) were there to read.
PEEKS = {
    "scikit-learn's own copy of the data": """
import pandas as pd
from sklearn.datasets import load_iris
whole = load_iris(as_frame=True).frame
whole.columns = [c.replace(" (cm)", "").replace(" ", "_") for c in whole.columns]
test = pd.read_csv("test.csv")
joined = test.merge(whole, how="left")
joined[["id", "target"]].to_csv("submission.csv", index=False)
""",
    "the split recomputed with a guessed secret": RECOMPUTE.format(secret=""),
    "a search of the whole file system": """
import os
DATA = (".csv", ".csv.gz", ".txt", ".arff", ".arff.gz", ".data", ".json", ".json.gz")
hits = []
for root, dirs, files in os.walk("/"):
    if root.startswith(("/proc", "/sys", "/dev")):
        dirs[:] = []
        continue
    hits += [os.path.join(root, f) for f in files if "iris" in f.lower() and f.lower().endswith(DATA)]
assert not hits, hits
raise SystemExit("nothing found")
""",
}


@pytest.mark.parametrize("name", PEEKS)
def test_a_solution_cannot_read_the_held_out_labels(mle, name):
    # the search of the whole file system takes about 10 s of the domain's 30 s, judged by its CPU and
    # own time, so a busy machine does not push it past the limit
    verdict = grade(mle, IRIS, PEEKS[name])
    assert verdict.diagnostics["verifier_score"] is None, verdict.reason
    assert verdict.solved is False
    expected = {
        "scikit-learn's own copy of the data": "FileNotFoundError",  # an empty folder over it
        "the split recomputed with a guessed secret": "test ids missing",
        "a search of the whole file system": "nothing found",  # no test data of scipy or scikit-learn either
    }
    assert expected[name] in verdict.reason


def test_the_recomputed_split_would_be_perfect_with_the_secret(mle):
    """The attack above is right but for the secret: run with the domain's secret (here, outside
    the sandbox) it finds every held-out id and label."""
    import hashlib

    import numpy as np

    parts = split("iris", "target", mle.secret)
    seed = int.from_bytes(hashlib.sha256(f"{mle.secret}/iris".encode()).digest()[:8], "big")
    rng = np.random.default_rng(seed)
    order = rng.permutation(150)
    assert tuple(int(i) for i in rng.choice(1_000_000, size=38, replace=False)) == parts.ids
    assert tuple(float(c) for c in order[:38] // 50) == parts.labels


WRITES = {
    "the root": "open('/escape', 'w').write('x')",
    "above its folder": "open('/work/../escape', 'w').write('x')",
    "the python environment": "import sys, os; open(os.path.join(sys.prefix, 'planted.pth'), 'w').write('x')",
    "the system": "open('/usr/lib/planted', 'w').write('x')",
}


@pytest.mark.parametrize("name", WRITES)
def test_a_solution_cannot_write_outside_its_folder(mle, name):
    verdict = grade(mle, IRIS, WRITES[name] + "\n" + solution(IRIS))
    assert verdict.solved is False and verdict.diagnostics["verifier_score"] is None
    assert "Error" in verdict.reason  # the write failed, and so did the solution


def test_a_submission_that_links_outside_is_not_read(mle):
    code = "import os\nos.symlink('/etc/passwd', 'submission.csv')"
    verdict = grade(mle, IRIS, code)
    assert "submission written" not in verdict.diagnostics["markers"] and verdict.diagnostics["verifier_score"] is None


def test_forged_markers_are_bounded_below_any_valid_score(mle):
    """A solution can append to the marker file (it runs in the process that records them); that buys
    at most the in-process markers, and the reward stays below the lowest valid score."""
    forge = f"with open('/propel-out/markers', 'a') as f:\n    f.write('\\n'.join({MARKERS!r}) + '\\n')"
    verdict = grade(mle, IRIS, forge)
    assert verdict.diagnostics["markers"] == list(IN_PROCESS)  # the verifier's three are not forgeable
    assert reward(verdict) == pytest.approx(-10 + 0.1 * len(IN_PROCESS)) and reward(verdict) < -1


def test_limits_end_a_runaway_solution_and_keep_what_it_reached(propel_registry):
    domain = propel_registry.domain("mle", time_limit=6.0)
    if not domain.sandbox.isolated:
        pytest.skip("needs every isolation layer")
    verdict = grade(domain, IRIS, "import numpy\nwhile True:\n    pass")
    assert verdict.diagnostics["status"] == "timeout" and verdict.diagnostics["markers"] == ["imports"]
    verdict = grade(domain, IRIS, "import numpy as np\nhog = np.ones(3 << 30, dtype=np.uint8)")  # 3 GiB, touched
    assert verdict.diagnostics["status"] in ("oom", "error") and "MemoryError" in verdict.reason + str(
        verdict.diagnostics
    )


@pytest.mark.parametrize(
    "mess",
    [
        "import os\nos.remove('/propel-out/markers')",
        "import os\nos.remove('/propel-out/markers')\nos.mkdir('/propel-out/markers')",
        "import os\nos.remove('/propel-out/markers')\nos.symlink('/etc/passwd', '/propel-out/markers')",
        "open('submission.csv', 'w').write('id,target\\ninf,1\\n1e999,2\\n')",
        "import os\nos.mkdir('submission.csv')",
    ],
)
def test_what_a_solution_leaves_behind_never_breaks_the_grader(mle, mess):
    verdict = grade(mle, IRIS, mess)
    assert verdict.solved is False and verdict.diagnostics["verifier_score"] is None  # graded, not ungradable


def test_an_attempt_without_code_reaches_nothing(mle):
    verdict = mle.grade(IRIS, "I would use a random forest.")
    assert verdict.diagnostics["markers"] == [] and reward(verdict) == pytest.approx(-10)
    attempt = grade_attempt(
        mle,
        Task(id="x", domain="mle", context_id="", generation="", generator="", payload=IRIS, validity=Validity.ok()),
        "no code",
    )
    assert attempt.solved is False


@pytest.mark.parametrize(
    "flood",
    [
        "\n" * ((4 << 20) - 20),  # blank lines: once 4 million empty rows, +336 MiB in the grader
        "\r\n" * ((2 << 20) - 20),
        "1,0\n" * ((1 << 20) - 20),  # rows that look like predictions
        "7," + "0" * ((4 << 20) - 40) + "\n",  # one enormous cell
    ],
    ids=["blank-lines", "crlf-lines", "rows", "one-cell"],
)
def test_the_grader_bounds_a_submission_by_the_test_set_before_building_rows(flood):
    """The grader runs outside the sandbox: whatever the file holds, it refuses it from its size and
    line count against the test set, without building rows from it (peak memory checked)."""
    import tracemalloc

    from propel_mle.environment import read_submission

    parts = split("iris", "target", "a secret")
    data = ("id,target\n" + flood).encode()
    tracemalloc.start()
    predictions, problem = read_submission(data, parts, "target", "accuracy")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert predictions is None and ("larger than" in problem or "lines for" in problem), problem
    assert peak < 1 << 20, f"{peak >> 20} MiB built from a refused submission"


def test_a_flooded_submission_from_a_real_run_is_invalid(mle):
    code = MALFORMED.replace(
        'pd.DataFrame({"row": test["id"], "label": model.predict(test[features])}).to_csv("submission.csv", index=False)',
        'sub = pd.DataFrame({"id": test["id"], "target": model.predict(test[features])})\n'
        'sub.to_csv("submission.csv", index=False)\n'
        'open("submission.csv", "a").write("\\n" * (3 << 20))',
    )
    verdict = grade(mle, IRIS, code)
    assert verdict.solved is False and verdict.diagnostics["verifier_score"] is None
    assert "lines for" in verdict.reason or "larger than" in verdict.reason, verdict.reason


def test_verdicts_are_the_same_graded_in_many_threads(mle):
    from propel_core.testing import assert_same_verdicts_concurrently

    codes = [solution(IRIS), MALFORMED, "import numpy as np\nraise RuntimeError('gave up')"]
    attempts = [(IRIS, f"```python\n{code}\n```") for code in codes] + [
        (DIABETES, f"```python\n{solution(DIABETES)}\n```")
    ]
    assert_same_verdicts_concurrently(mle, attempts, threads=4, rounds=1)


OVERFLOW = """
import pandas as pd
test = pd.read_csv("test.csv")
pd.DataFrame({"id": test["id"], "target": 1e200}).to_csv("submission.csv", index=False)
"""


def test_an_overflowing_metric_is_not_solved_and_its_verdict_is_still_a_record(mle, tmp_path):
    """Predictions near 1e200 are valid numbers whose rmse overflows: the attempt is rightly not
    solved, and its verdict stays writable (the non-finite values become None, with the reason), so
    solve-train's rollout log and the label stage keep it."""
    from propel_core.records import JsonlWriter, SolverAttempt, iter_jsonl

    verdict = grade(mle, DIABETES, OVERFLOW)
    assert verdict.solved is False and verdict.diagnostics["metric_value"] is None
    assert "non-finite" in verdict.diagnostics["unrecordable"]["metric_value"]
    task = Task(
        id="t", domain="mle", context_id="", generation="", payload=DIABETES, generator="", validity=Validity.ok()
    )
    attempt = grade_attempt(mle, task, f"```python\n{OVERFLOW}\n```")
    assert attempt.solved is False
    with JsonlWriter(tmp_path / "attempts.jsonl") as out:
        assert out.write(attempt) and out.write(attempt.diagnostics | {"step": 0})
    assert next(iter_jsonl(tmp_path / "attempts.jsonl", SolverAttempt)) == attempt


def test_verdicts_are_the_same_idle_and_at_8x_oversubscription(propel_registry):
    """A right solution, a crash, a malformed submission and a sleeper, graded idle and beside sixteen
    CPU hogs on two cores: the same verdict, status, markers and score (runs are judged by their CPU
    and own time, docs/sandbox.md "Time"; the endless loop is the sandbox's own test)."""
    from propel_core.testing import assert_same_verdicts_under_load

    domain = propel_registry.domain("mle", time_limit=12.0)
    if not domain.sandbox.isolated:
        pytest.skip("needs every isolation layer")

    def verdict(code):
        found = grade(domain, IRIS, code)
        diagnostics = found.diagnostics
        return found.solved, diagnostics["status"], diagnostics["markers"], diagnostics["verifier_score"]

    codes = {
        "right": solution(IRIS),
        "a crash": "import numpy as np\nraise RuntimeError('gave up')",
        "malformed": MALFORMED,
        "a sleeper": "import numpy\nimport time\ntime.sleep(10 ** 6)",
    }
    found = assert_same_verdicts_under_load(verdict, codes)
    assert [found[name][:2] for name in codes] == [(True, "ok"), (False, "error"), (False, "ok"), (False, "timeout")]
