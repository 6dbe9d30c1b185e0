"""The arithmetic domain: contexts, parsing, validity, grading, topics and workflow markers."""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from propel_core.domain import ParseError, make_task
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.testing import assert_same_verdicts_concurrently


@pytest.fixture
def domain(propel_registry):
    return propel_registry.domain("arithmetic")


@pytest.fixture
def predicates(propel_registry, domain):
    return propel_registry.validity_predicates(domain)


def test_shows_up_in_propel_plugins(propel_registry):
    described = {p["name"]: p for p in propel_registry.describe()}
    assert described["arithmetic"]["registers"] == {
        "domains": ["arithmetic"],
        "model_backends": ["arithmetic_skill"],
        "validity_predicates": ["arithmetic_well_formed"],
    }


def test_contexts_show_two_well_formed_exercises(domain, predicates):
    contexts = domain.contexts()
    assert len(contexts) == 48 and len({c.id for c in contexts}) == 48
    assert {c.bucket for c in contexts} == {
        "1 operation, 1-digit",
        "1 operation, 2-digit",
        "2 operations, 1-digit",
        "2 operations, 2-digit",
    }
    for context in contexts:
        for example in context.data["examples"]:
            task = make_task("t", domain, context, f"Compute: {example}", "m", predicates)
            assert task.validity.valid, (example, task.validity.reason)
    prompt = domain.generator_prompt(contexts[0])
    assert prompt[-1] == {"role": "assistant", "content": "Compute:"}
    assert contexts[0].data["examples"][0] in prompt[0]["content"]


@pytest.mark.parametrize(
    ("generation", "expression"),
    [
        ("Compute: 12 + 7", "12 + 7"),
        ("Compute: 6 / 6 = 1", "6 / 6"),  # the answer is not part of the exercise
        ("Compute:  23 * 4?\nmore text", "23 * 4"),
        ("compute 5 - 2.", "5 - 2"),
    ],
)
def test_parse(domain, generation, expression):
    assert domain.parse(generation) == {"expression": expression}
    assert domain.render(domain.parse(generation)) == f"Compute: {expression}"


@pytest.mark.parametrize("generation", ["no exercise here", "Compute:", "Compute: = 4"])
def test_parse_rejects(domain, generation):
    with pytest.raises(ParseError):
        domain.parse(generation)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("12 + 7", None),
        ("(5 + 3) * 2", None),
        ("2 - 9", None),  # negative values are fine
        ("7", "needs 1-2 operations, has 0"),
        ("1 + 2 + 3 + 4", "needs 1-2 operations, has 3"),
        ("150 + 2", "operands must be at most 100"),
        ("7 / 2", "the value must be a whole number of at most 10000 in size"),
        ("99 * 99 * 99", "the value must be a whole number of at most 10000 in size"),
        ("x + 1", "only integers and + - * / are allowed, found Name"),
        ("5 / 0", "division by zero"),
        ("2 ** 8", "only integers and + - * / are allowed, found BinOp"),
    ],
)
def test_validity(domain, predicates, expression, reason):
    task = make_task("t", domain, domain.contexts()[0], f"Compute: {expression}", "m", predicates)
    assert task.validity.valid is (reason is None)
    if reason:
        assert task.validity.reason == f"arithmetic_well_formed: {reason}"


@pytest.mark.parametrize(
    ("attempt", "solved"),
    [
        ("Answer: 19", True),
        ("Answer: 12 + 7 = 19", True),  # the last number of the first line
        ("Answer: 19.0", True),
        ("Answer: 18\n19", False),  # later lines do not count
        ("Answer: nineteen", False),
        ("Answer:", False),
    ],
)
def test_grade(domain, attempt, solved):
    verdict = domain.grade({"expression": "12 + 7"}, attempt)
    assert verdict.solved is solved
    assert verdict.diagnostics["missing_answer"] is (attempt in ("Answer: nineteen", "Answer:"))
    assert domain.solver_prompt({"expression": "12 + 7"})[-1] == {"role": "assistant", "content": "Answer:"}


def test_topics_and_markers(domain):
    assert domain.topic({"expression": "3 * 4 + 2"}) == "addition and multiplication"
    assert domain.markers_reached("nothing") == []
    assert domain.markers_reached("Compute: = 4") == ["compute line"]
    assert domain.markers_reached("Compute: x + 1") == ["compute line", "parsed"]
    assert domain.markers_reached("Compute: 300 + 1") == ["compute line", "parsed", "evaluates"]
    assert domain.markers_reached("Compute: 3 + 1") == list(domain.workflow_markers)


@functools.cache
def shared():
    from propel_core.plugins import Registry

    registry = Registry.build()
    domain = registry.domain("arithmetic", num_contexts=1)
    return domain, registry.validity_predicates(domain)


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("Compute: 0123456789+-*/()=.x\n")), max_size=60) | st.text(max_size=60))
def test_parse_validity_grading_never_raise(text):
    domain, predicates = shared()
    task = make_task("t", domain, domain.contexts()[0], text, "m", predicates)
    assert task.validity.valid or task.validity.reason
    assert isinstance(domain.markers_reached(text), list)
    if task.validity.valid:
        assert domain.grade(task.payload, text).solved in (True, False)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("3 + 7", 0.95),  # nothing beyond one digit, one operation, no product
        ("23 + 4", 0.95 * 0.8),  # one extra digit
        ("7 * 8", 0.95 * 0.55),  # a product
        ("23 * 45", 0.95 * 0.8**2 * 0.55),
        ("23 * 45 * 12", 0.95 * 0.8**3 * 0.55**2 * 0.7),  # a second operation
        ("99 - 12 / 3", 0.95 * 0.8**2 * 0.55 * 0.7),
    ],
)
def test_the_simulated_solver_succeeds_as_its_formula_says(expression, expected):
    from propel_arithmetic.skill import success_probability

    assert success_probability(expression) == pytest.approx(expected)


def test_the_simulated_solver_answers_at_its_rate_and_repeats_itself(propel_registry, domain):
    """Over many attempts the share of right answers (graded by the domain) is the formula's chance,
    a seed gives the same answers again, and other seeds give other ones."""
    from propel_core.config import ModelConfig, Sampling

    backend = propel_registry.backend(ModelConfig(backend="arithmetic_skill"))
    payloads = [{"expression": "23 * 45"}, {"expression": "3 + 7"}]
    prompts = [domain.solver_prompt(payload) for payload in payloads]
    answers = backend.generate(prompts, Sampling(), n=2000, seed=[5, 6])
    for payload, attempts, chance in zip(payloads, answers, (0.95 * 0.64 * 0.55, 0.95), strict=True):
        right = sum(domain.grade(payload, attempt).solved for attempt in attempts) / len(attempts)
        assert right == pytest.approx(chance, abs=0.035)  # about 3 standard errors
    assert backend.generate(prompts, Sampling(), n=2000, seed=[5, 6]) == answers
    assert backend.generate(prompts, Sampling(), n=2000, seed=[7, 8]) != answers


def test_the_simulated_solver_refuses_what_it_cannot_answer(propel_registry):
    from propel_core.config import ModelConfig, Sampling
    from propel_core.errors import PropelError

    backend = propel_registry.backend(ModelConfig(backend="arithmetic_skill"))
    with pytest.raises(PropelError, match="answers only the arithmetic domain's solver prompt"):
        backend.generate(["Write a poem."], Sampling())
    with pytest.raises(PropelError, match="has no hidden states"):
        backend.hidden_states(["Compute: 3 + 4"], [1], 64)


def test_verdicts_are_the_same_graded_in_many_threads():
    domain = Registry.build().domain("arithmetic")
    expressions = ["12 + 7", "3 * (4 - 9)", "100 / 8", "2 * 512", "17 - 25 + 4"]
    answers = ["19", "-15", "12.5", "1024", "-4", "20", "no idea", "12 + 7 = 19\n20"]
    attempts = [({"expression": e}, a) for e in expressions for a in answers]
    assert_same_verdicts_concurrently(domain, attempts, threads=8)


def test_solver_shots_put_worked_exercises_first(propel_registry):
    from propel_arithmetic.plugin import value_of

    zero = propel_registry.domain("arithmetic").solver_prompt({"expression": "12 + 7"})
    shots = propel_registry.domain("arithmetic", solver_shots=3).solver_prompt({"expression": "12 + 7"})
    assert len(zero) == 2 and len(shots) == 8 and shots[-2:] == zero
    asked = [q["content"].removeprefix("Compute ").removesuffix(". Reply with the number only.") for q in shots[:-2:2]]
    answers = [a["content"] for a in shots[1:-2:2]]
    assert answers == [f"Answer: {value_of(expression)}" for expression in asked]
    contexts = {e for c in propel_registry.domain("arithmetic").contexts() for e in c.data["examples"]}
    assert len(set(asked)) == 3 and not contexts & set(asked)
    with pytest.raises(PropelError, match="solver_shots >= 0"):
        propel_registry.domain("arithmetic", solver_shots=-1)
    for options in (  # too few exercises left to draw: an error, not a hang
        {"solver_shots": 50, "max_operand": 2, "max_operators": 1},
        {"solver_shots": 20_000},
        {"solver_shots": 3, "max_value": 1, "max_operand": 2, "max_operators": 1},
    ):
        with pytest.raises(PropelError, match="1,000 draws in a row found no new exercise"):
            propel_registry.domain("arithmetic", **options)
    with pytest.raises(PropelError, match="max_value >= 1"):
        propel_registry.domain("arithmetic", max_value=-1)
    for bad in (1.5, True, "3"):
        with pytest.raises(PropelError, match="whole number"):
            propel_registry.domain("arithmetic", solver_shots=bad)
    one_operation = propel_registry.domain("arithmetic", solver_shots=3, max_operators=1)
    assert len(one_operation.solver_prompt({"expression": "2 + 3"})) == 8


def test_solver_prompts_are_the_same_built_in_many_threads(propel_registry):
    """Label workers build prompts at once: a cache or draw added to solver_prompt must not race."""
    from concurrent.futures import ThreadPoolExecutor

    domain = propel_registry.domain("arithmetic", solver_shots=3)
    shots = [
        m["content"].removeprefix("Compute ").removesuffix(". Reply with the number only.")
        for m in domain.solver_prompt({"expression": "2 + 3"})[:-2:2]
    ]
    payloads = [{"expression": e} for e in [*shots, "12 + 7", "3 * (4 - 9)", "100 / 8", "17 - 25 + 4"] * 50]
    serial = [domain.solver_prompt(payload) for payload in payloads]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(domain.solver_prompt, payloads)) == serial


def test_a_shot_is_never_the_task_in_any_order(propel_registry):
    """A task that is one of the worked exercises (or it with its operands swapped) gets the spare
    shot in its place, so the prompt never holds its own answer; the simulated solver reads the task."""
    from propel_arithmetic.skill import ArithmeticSkill

    from propel_core.config import ModelConfig

    domain = propel_registry.domain("arithmetic", solver_shots=3)
    asked = [m["content"] for m in domain.solver_prompt({"expression": "2 + 3"})[:-2:2]]
    shots = [question.removeprefix("Compute ").removesuffix(". Reply with the number only.") for question in asked]
    for shot in shots:
        for expression in (shot, " ".join(reversed(shot.split(" ")))):
            questions = [m["content"] for m in domain.solver_prompt({"expression": expression}) if m["role"] == "user"]
            assert len(questions) == 4 and questions[-1] == f"Compute {expression}. Reply with the number only."
            assert not any(expression in question or shot in question for question in questions[:-1])
    solver = ArithmeticSkill(ModelConfig())
    answers = solver.generate([domain.solver_prompt({"expression": "2 + 3"})], None, n=20, seed=0)[0]
    assert " 5" in answers  # it answers the task, not the first worked exercise


@pytest.mark.slow
def test_generate_stops_at_the_line_end_and_rejects_what_the_length_limit_cut(tmp_path, propel_registry):
    """The domain's stop string ends each exercise at its line on the real model: at 24 tokens only a
    line that rambles on is cut off; at 3 most are, and those are invalid unparsed, as train pays them."""
    from propel_core.domain import CUT_OFF
    from propel_core.plans import validate_config
    from propel_core.records import Task, iter_jsonl
    from propel_core.run import Run
    from propel_core.stages.generate import generate

    def generated(limit: int) -> list[Task]:
        data = {
            "run_dir": str(tmp_path / str(limit)),
            "domain": {"name": "arithmetic"},
            "generate": {"num_tasks": 12},
            "generator": {"sampling": {"max_new_tokens": limit}},
        }
        run = Run(validate_config(data, propel_registry), propel_registry, quiet=True)
        generate(run)
        return list(iter_jsonl(run.dir / "tasks.jsonl", Task))

    whole, cut = generated(24), generated(3)
    assert all("\n" not in task.generation for task in whole) and sum(task.validity.valid for task in whole) >= 4
    cut_off = [task for task in cut if task.validity.reason == CUT_OFF]
    assert len(cut_off) >= 8 > sum(task.validity.reason == CUT_OFF for task in whole)
    assert all(task.payload is None for task in cut_off)
