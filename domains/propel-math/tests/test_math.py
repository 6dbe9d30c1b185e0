"""The math domain: pools, parsing, specification rules, answer extraction, grading, oracle policy."""

import functools
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from propel_core import hookimpl
from propel_core.domain import ParseError, make_task
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.records import Context, Task, Validity
from propel_core.testing import assert_same_verdicts_concurrently
from propel_math.plugin import check_oracle, check_spec, extract_answer
from propel_math.pools import BUILTIN_POOLS, builtin_pool, load_pool
from propel_math.verify import Verifier


def test_shows_up_in_propel_plugins(propel_registry):
    described = {p["name"]: p for p in propel_registry.describe()}
    assert described["math"]["registers"] == {"domains": ["math"], "validity_predicates": ["math_oracle", "math_spec"]}


@pytest.fixture(scope="module")
def domain():
    return Registry.build().domain("math")


@pytest.mark.parametrize("name", sorted(BUILTIN_POOLS))
def test_builtin_pools(name):
    pool = builtin_pool(name)
    assert len(pool) >= 40 and len({p["problem"] for p in pool}) == len(pool)
    assert all(p["answer"] and p["problem"].strip() for p in pool)
    assert builtin_pool(name) == pool  # reproducible


def test_known_answers():
    answers = {p["problem"]: p["answer"] for name in BUILTIN_POOLS for p in builtin_pool(name)}
    checks = {"How many positive divisors does 420 have?": "24", "How many zeros does $125!$ end with?": "31"}
    for problem, answer in checks.items():
        if problem in answers:
            assert answers[problem] == answer
    assert any(problem in answers for problem in checks)


def test_user_pool_jsonl(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "What is 2+2?", "final": 4}) + "\n")
    assert load_pool(path, "question", "final") == [{"problem": "What is 2+2?", "answer": "4"}]
    with pytest.raises(ValueError, match="lack 'problem' or 'answer'"):
        load_pool(path)
    spec = {"path": str(path), "problem_key": "question", "answer_key": "final"}
    domain = Registry.build().domain("math", pools=[], user_pools={"gsm": spec}, contexts_per_pool=1)
    assert list(domain.pools) == ["gsm"] and domain.pools["gsm"][0]["answer"] == "4"


def test_user_pool_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="parquet pools need the optional pyarrow")
    import pyarrow as pa

    pq.write_table(pa.table({"problem": ["Find x if 2x = 6."], "answer": ["3"]}), tmp_path / "p.parquet")
    assert load_pool(tmp_path / "p.parquet") == [{"problem": "Find x if 2x = 6.", "answer": "3"}]


def test_unknown_builtin_pool():
    with pytest.raises(
        PropelError,
        match=r"^domain 'math' of plugin 'math' could not be made \(options: pools=\['aime'\]\): "
        r"ValueError: unknown built-in pool.*built in: grade_school, competition, olympiad",
    ):
        Registry.build().domain("math", pools=["aime"])


def test_contexts_and_prompt(domain):
    contexts = domain.contexts()
    assert len(contexts) == 96 and {c.bucket for c in contexts} == set(BUILTIN_POOLS)
    messages = domain.generator_prompt(contexts[0])
    assert messages[-1] == {"role": "assistant", "content": "Problem:"}
    assert messages[0]["content"].count("Problem: ") == 2


@pytest.mark.parametrize(
    ("generation", "problem"),
    [
        ("Problem: What is 3 + 4?", "What is 3 + 4?"),
        ("Problem: Find the sum of 2 and 5.\nSolution: 7", "Find the sum of 2 and 5."),
        ("Problem:  How many cats?\n\nAnswer: 4\nProblem: another", "How many cats?"),
        ("What is 6 times 7?", "What is 6 times 7?"),
    ],
)
def test_parse(domain, generation, problem):
    assert domain.parse(generation) == {"problem": problem}


def test_parse_rejects_empty(domain):
    with pytest.raises(ParseError, match="no problem statement"):
        domain.parse("Problem:\nSolution: 5")


def spec(domain, problem: str) -> Validity:
    task = Task(
        id="t",
        domain="math",
        context_id="c",
        generation="",
        generator="m",
        validity=Validity.ok(),
        payload={"problem": problem},
    )
    return check_spec(task, domain)


@pytest.mark.parametrize(
    ("problem", "reason"),
    [
        ("How many positive divisors does 360 have?", None),
        ("Find the remainder when $7^{100}$ is divided by 13.", None),
        ("Short?", "length 6 outside 20..1500 characters"),
        ("What is 2 + 3? The answer is 5.", "the statement leaks an answer or solution"),
        ("Compute $\\boxed{4}$ squared, please, as a number.", "the statement leaks an answer or solution"),
        ("Prove that there are infinitely many primes.", "asks for a proof, not a single final answer"),
        ("A box holds balls. (a) How many are red? (b) How many are blue", "has several parts"),
        ("What is 2 + 3? What is 4 + 5?", "asks more than one question"),
        ("The farmer has seven cows and two dogs in a barn.", "asks no question"),
    ],
)
def test_spec_rules(domain, problem, reason):
    validity = spec(domain, problem)
    assert validity.valid is (reason is None), validity
    if reason:
        assert validity.reason.startswith(reason)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so the total is \\boxed{42}.", "42"),
        ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),
        ("Answer: 17 apples.", "17 apples"),
        ("the answer is $3\\pi$", "3\\pi"),
        ("I get 12, then 15.", "15"),
        ("\\boxed{12", None),  # a box cut off is no final answer (math-verify: none either)
        ("no idea", None),
        # the final expression, never a digit inside LaTeX
        ("Solving, we get $x = \\frac{1}{2}$.", "\\frac{1}{2}"),
        ("The mean is $\\frac{3 + 4}{2} = \\frac{7}{2}$", "\\frac{7}{2}"),
        ("There are $2^{10}$ subsets.", "2^{10}"),
        ("Hence \\(x=\\frac{3}{4}\\), and \\[ y = 2\\sqrt{3} \\]", "2\\sqrt{3}"),
        ("$$x \\approx 0.33$$", "0.33"),
        ("Answer: \\(x = 5\\).", "5"),
        ("so \\sqrt{2}", None),
        ("3 sets, 2^{10} subsets", "3"),
        ("costs $5 and $6 total", "6"),  # dollar signs that open and close no math
        # \\$ is a dollar sign; thousands separators and percent signs
        ("\\boxed{\\$1,000}", "1,000"),
        ("So the price is $\\$12.50$.", "12.50"),
        ("It costs \\$5.", "5"),
        ("The total is 1,000 dollars.", "1000"),
        ("The probability is 50%.", "50\\%"),
        ("Answer: 50%", "50\\%"),
        ("\\boxed{50\\%}", "50\\%"),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("attempt", "solved"),
    [
        ("Half of it: \\boxed{\\frac{1}{2}}", True),
        ("So the answer is \\boxed{0.5}.", True),
        ("Answer: 1/2", True),
        ("\\boxed{\\frac{2}{4}}", True),
        ("\\boxed{0.25}", False),
        ("The answer is one half.", False),
        ("", False),
    ],
)
def test_grader_on_hand_checked_attempts(domain, attempt, solved):
    verdict = domain.grade({"problem": "p", "answer": "\\frac{1}{2}"}, attempt)
    assert verdict.solved is solved, verdict


# (gold, attempt, solved): equivalent and non-equivalent written forms, graded by hand
PEER_TABLE = [
    ("42", "so the total is \\boxed{42}.", True),
    ("42", "\\boxed{24}", False),
    ("$\\frac{1}{2}$", "Half of it: \\boxed{\\frac{1}{2}}", True),
    ("$\\frac{1}{2}$", "\\boxed{0.5}", True),
    ("$\\frac{1}{2}$", "\\boxed{\\dfrac{2}{4}}", True),
    ("$\\frac{1}{2}$", "\\boxed{0.25}", False),
    ("$\\frac{1}{2}$", "first \\boxed{\\frac{1}{3}}, no: \\boxed{\\frac{1}{2}}", True),
    ("$2\\sqrt{3}$", "\\boxed{\\sqrt{12}}", True),
    ("$2\\sqrt{3}$", "\\boxed{2\\sqrt{2}}", False),
    ("1024", "\\boxed{2^{10}}", True),
    ("1024", "\\boxed{2^{11}}", False),
    ("$3\\pi$", "\\boxed{3\\pi}", True),
    ("$\\frac{3}{4}$", "\\boxed{x = \\frac{3}{4}}", True),
    ("$x^2 + 1$", "\\boxed{1 + x^2}", True),
    ("$x^2 + 1$", "\\boxed{x^2 - 1}", False),
    ("$(2, 3)$", "\\boxed{(2,3)}", True),
    ("12", "\\boxed{12", False),
    ("$\\frac{1}{2}$", "so \\boxed{\\frac{1}{2}", False),
    # \\$ (a dollar sign), percent, units
    ("12.50", "\\boxed{\\$12.50}", True),
    ("5", "It costs \\boxed{\\$5}.", True),
    ("5", "\\boxed{\\$6}", False),
    ("1000", "\\boxed{\\$1,000}", True),
    ("12.50", "So the price is $\\$12.50$.", True),
    ("5", "It costs \\$5.", True),
    ("1000", "Answer: \\$1,000", True),
    ("50", "\\boxed{50\\%}", True),
    ("25", "\\boxed{50\\%}", False),
    ("$\\frac{1}{2}$", "Answer: 50%", True),
    ("$\\frac{1}{2}$", "Answer: 25%", False),
    ("$\\frac{1}{2}$", "The probability is 50%.", True),
    ("12", "\\boxed{12 \\text{ cm}}", True),
    ("12", "The side is 12 cm.", True),
    # answer lines
    ("17", "Answer: 17 apples.", True),
    ("17", "Answer: 18", False),
    ("$\\frac{1}{2}$", "Answer: 1/2", True),
    ("$3\\pi$", "the answer is $3\\pi$", True),
    ("$\\sqrt{2}$", "The answer is $\\sqrt{2}$.", True),
    ("$\\sqrt{2}$", "The final answer is $\\sqrt{3}$.", False),
    ("5", "Answer: \\(x = 5\\).", True),
    # no box, no answer line: the last math span
    ("$\\frac{1}{2}$", "Solving, we get $x = \\frac{1}{2}$.", True),
    ("2", "Solving, we get $x = \\frac{1}{2}$.", False),
    ("$\\sqrt{2}$", "so the length is $\\sqrt{2}$", True),
    ("2", "so the length is $\\sqrt{2}$", False),
    ("1024", "There are $2^{10}$ subsets.", True),
    ("10", "There are $2^{10}$ subsets.", False),
    ("$\\frac{3}{4}$", "Hence \\(x=\\frac{3}{4}\\).", True),
    ("$2\\sqrt{3}$", "Thus \\[ y = 2\\sqrt{3} \\]", True),
    ("6", "We have $a = 2$ and $b = 3$, so $ab = 6$.", True),
    ("3", "We have $a = 2$ and $b = 3$, so $ab = 6$.", False),
    ("$\\frac{7}{2}$", "The mean is $\\frac{3 + 4}{2} = \\frac{7}{2}$", True),
    ("$\\frac{7}{2}$", "$$\\frac{3+4}{2} = 3.5$$", True),
    ("0.33", "so $x \\approx 0.33$", True),
    # no LaTeX at all: the last number
    ("15", "I get 12, then 15.", True),
    ("12", "I get 12, then 15.", False),
    ("1000", "The total is 1,000 dollars.", True),
    ("-3", "so x is -3", True),
    ("0.75", "which gives 3/4", True),
    ("6", "costs $5 and $6 total", True),
    ("$\\sqrt{2}$", "so \\sqrt{2}", False),  # LaTeX outside math mode: no answer (math-verify: none either)
    ("2", "so \\sqrt{2}", False),
    ("5", "no idea", False),
    ("5", "", False),
]
# where math-verify's verdict differs from ours, and why ours is kept
KNOWN_DISAGREEMENTS = {
    "first \\boxed{\\frac{1}{3}}, no: \\boxed{\\frac{1}{2}}": "math-verify reads all boxes as one set {1/3, 1/2}; "
    "we take the last box, the attempt's final word",
    "so \\boxed{\\frac{1}{2}": "math-verify reads a box cut off by the end of the text; we take it as no answer "
    "(math-verify itself finds none in '\\boxed{12')",
    "It costs \\$5.": "math-verify finds no answer after a \\$ outside math; we read \\$ as a dollar sign",
    "Answer: \\$1,000": "math-verify finds no answer after a \\$ outside math; we read \\$ as a dollar sign",
}


def test_peer_table_is_consistent():
    assert len(PEER_TABLE) >= 40 and len({(gold, attempt) for gold, attempt, _ in PEER_TABLE}) == len(PEER_TABLE)
    assert set(KNOWN_DISAGREEMENTS) <= {attempt for _, attempt, _ in PEER_TABLE}


@pytest.mark.parametrize(("gold", "attempt", "solved"), PEER_TABLE)
def test_grader_agrees_with_math_verify(domain, gold, attempt, solved):
    """Our grader (extraction, then math-verify in the worker) against math-verify reading the whole attempt."""
    math_verify = pytest.importorskip("math_verify")
    assert domain.grade({"problem": "p", "answer": gold}, attempt).solved is solved
    peer = math_verify.verify(math_verify.parse(gold), math_verify.parse(attempt))
    assert peer is (solved if attempt not in KNOWN_DISAGREEMENTS else not solved), KNOWN_DISAGREEMENTS.get(attempt)


def test_grader_without_reference_is_ungradable(domain):
    assert domain.grade({"problem": "p"}, "\\boxed{1}").solved is None


def test_verifier_timeout_then_recovers():
    """Start-up has its own allowance, so even a new worker's first request gets only ``timeout``."""
    verifier = Verifier(timeout=1.0)
    started = time.monotonic()
    assert verifier.equal("7", "9^{9^{9^{9}}}") is None  # no reply within the second: killed
    assert time.monotonic() - started < 30
    assert verifier.equal("3", "3") is True  # a new worker
    verifier.close()


def test_verdicts_are_the_same_graded_in_many_threads(domain):
    """The executor grades from many threads at once: each thread gets a math-verify worker of its
    own (one shared worker gave 8 of 16 verdicts wrong in 8 threads, 4 wrong answers solved)."""
    attempts = [({"problem": "p", "answer": gold}, attempt) for gold, attempt, _ in PEER_TABLE[:16]]
    assert_same_verdicts_concurrently(domain, attempts, threads=8, rounds=2)


def test_an_answer_the_verifier_cannot_finish_is_not_solved():
    """A tower of powers makes the verifier run out of time on the answer: with the reference
    comparing in time, that is the attempt's doing (not solved), never ungradable; a reference that
    cannot be compared in time leaves the attempt ungradable."""
    domain = Registry.build().domain("math", verify_timeout=2.0)
    verdict = domain.grade({"problem": "p", "answer": "7"}, "\\boxed{9^{9^{9^{9}}}}")
    assert verdict.solved is False and "no verdict" in verdict.reason, verdict.reason
    assert domain.grade({"problem": "p", "answer": "7"}, "\\boxed{7}").solved is True  # its worker was replaced
    broken = Registry.build().domain("math")
    broken.verifier = Verifier(memory_mb=1)  # no worker can start: the harness fails, not the attempt
    verdict = broken.grade({"problem": "p", "answer": "7"}, "\\boxed{7}")
    assert verdict.solved is None and "did not answer" in verdict.reason


def test_verdicts_are_the_same_idle_and_beside_cpu_hogs():
    """The verifier judges a comparison by its worker's CPU and own time, not the wall clock: right,
    wrong and unfinishable answers (a tower of powers, past the 2 s limit in CPU time) get the same
    verdicts beside sixteen CPU hogs on two cores. (The comparisons here take a fraction of the limit,
    so this guards the verdicts under load; the sandbox's own tests show the wall clock's failure.)"""
    from propel_core.testing import assert_same_verdicts_under_load

    domain = Registry.build().domain("math", verify_timeout=2.0)
    cases = {"right": "\\boxed{0.5}", "wrong": "\\boxed{2}", "unfinishable": "\\boxed{9^{9^{9^{9}}}}"}
    found = assert_same_verdicts_under_load(
        lambda text: domain.grade({"problem": "p", "answer": "\\frac{1}{2}"}, text).solved, cases
    )
    assert found == {"right": True, "wrong": False, "unfinishable": False}


def scripted_oracles(replies):
    """A backend plugin whose instances (one per oracle) answer from one shared script, in call order."""
    script = iter(replies)

    class Scripted:
        model_id = "scripted"

        def __init__(self, model):
            self.model = model

        def generate(self, prompts, sampling, n=1, seed=None):
            return [[next(script) for _ in range(n)] for _ in prompts]

    class Plugin:
        @staticmethod
        @hookimpl
        def register_model_backends(register):
            register("scripted", Scripted)

    return Plugin


@pytest.mark.parametrize(
    ("replies", "valid", "reason"),
    [
        (["\\boxed{6}", "so 6", "Answer: 6.0", "\\boxed{\\frac{12}{2}}"], True, None),
        (["\\boxed{6}", "\\boxed{6}", "\\boxed{7}", "\\boxed{6}"], False, "unscorable: oracles disagree"),
        (["\\boxed{6}", "no idea", "\\boxed{6}", "\\boxed{6}"], False, "unscorable: an oracle attempt gave no final"),
    ],
)
def test_oracle_policy(propel_register_plugin, replies, valid, reason):
    registry = propel_register_plugin(scripted_oracles(replies))
    domain = registry.domain("math", oracles=["a", "b"], oracle_backend="scripted")
    task = Task(
        id="t",
        domain="math",
        context_id="c",
        generation="",
        generator="m",
        validity=Validity.ok(),
        payload={"problem": "What is 2 * 3?"},
    )
    validity = check_oracle(task, domain)
    assert validity.valid is valid
    assert len(task.payload["oracle_answers"]) == 4
    if valid:
        assert task.payload["answer"] == "6"
    else:
        assert validity.reason.startswith(reason) and "answer" not in task.payload


@pytest.mark.slow
def test_oracle_policy_with_the_embedded_model():
    """Greedy oracles agree with themselves, so the real model's answer becomes the reference."""
    domain = Registry.build().domain("math", oracle_sampling={"temperature": 0.0, "max_new_tokens": 48})
    task = Task(
        id="t",
        domain="math",
        context_id="c",
        generation="",
        generator="m",
        validity=Validity.ok(),
        payload={"problem": "What is 12 + 30?"},
    )
    validity = check_oracle(task, domain)
    answers = task.payload["oracle_answers"]
    assert len(answers) == 4 and len(set(answers)) == 1
    assert validity.valid is (answers[0] is not None)


@pytest.mark.slow
def test_generate_on_the_embedded_model(propel_cli, tmp_path):
    config = tmp_path / "math.yaml"
    config.write_text(
        f"run_dir: {tmp_path}\ndomain:\n  name: math\n  options:\n    oracle_sampling: {{max_new_tokens: 32}}\n"
        "generate:\n  num_tasks: 3\ngenerator:\n  sampling: {max_new_tokens: 48}\n"
    )
    out = propel_cli("-q", "generate", str(config)).stdout
    assert out.startswith("generated 3 -> parsed")
    from propel_core.records import iter_jsonl

    tasks = list(iter_jsonl(tmp_path / "tasks.jsonl", Task))
    assert len(tasks) == 3 and all(t.generation.startswith("Problem:") for t in tasks)
    for task in tasks:
        assert task.validity.valid or task.validity.reason
        if task.validity.valid:
            assert task.payload["answer"] and task.topic


@functools.cache
def shared():
    """The domain with only its specification rules: the oracles (real models) are tested above."""
    registry = Registry.build()
    domain = registry.domain("math", contexts_per_pool=1)
    domain.validity_predicates = ("math_spec",)
    return domain, {"math_spec": registry.get("validity_predicates", "math_spec")}


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=400) | st.builds(lambda s: "Problem: " + s, st.text(max_size=300)))
def test_parse_and_spec_never_raise(text):
    domain, predicates = shared()
    task = make_task("t", domain, Context(id="c", data={}), text, "m", predicates)
    assert task.validity.valid or task.validity.reason


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=300))
def test_extract_answer_never_raises(text):
    answer = extract_answer(text)
    assert answer is None or isinstance(answer, str)
