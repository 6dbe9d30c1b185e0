"""The math domain: competition-style problems written from two in-context examples, reference
answers by the paper's oracle policy, solver answers compared symbolically with math-verify."""

from __future__ import annotations

import random
import re
import threading
from functools import cached_property
from typing import Any

from propel_core import Context, Domain, Messages, ModelConfig, ParseError, Sampling, Task, Validity, Verdict, hookimpl
from propel_math.pools import BUILTIN_POOLS, builtin_pool, load_pool
from propel_math.verify import Overloaded, Verifier


@hookimpl
def register_domains(register):
    register("math", Math)


@hookimpl
def register_validity_predicates(register):
    register("math_spec", check_spec)
    register("math_oracle", check_oracle)


SECTION_END = re.compile(r"^\s*(solution|answer|hint|explanation|problem|note)\b", re.IGNORECASE | re.MULTILINE)
ASKS = re.compile(r"\?|\b(find|compute|determine|calculate|evaluate|how many|how much|what|which|express)\b", re.I)
PROOF = re.compile(r"\b(prove|show that|justify)\b", re.IGNORECASE)
PARTS = re.compile(r"(^|\s)\(?(a|b|c|i|ii|iii)\)\s", re.IGNORECASE)
LEAK = re.compile(r"\\boxed|\banswer\s*(is|:|=)|\bsolution\s*:", re.IGNORECASE)
ANSWER_LINE = re.compile(r"answer\s*(?:is|:)[ \t]*([^\n]+)", re.IGNORECASE)
# $$...$$, $...$ (opened before and closed after a non-space, as in pandoc), \(...\), \[...\]
MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(?=\S)(.+?)(?<=\S)\$(?!\d)|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
RELATION = re.compile(r"(?<![<>!])=|\\approx")
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?%?")
LATEX = re.compile(r"[\\^_{}]")
PERCENT = re.compile(r"(?<!\\)%")

TOPICS = (
    ("probability", r"probabilit|dice|\bdie\b|coin|chance|random"),
    ("combinatorics", r"how many ways|in how many|arrange|subsets?|committee|permutation|strings? of length|choose"),
    ("geometry", r"triangle|circle|area|perimeter|angle|square|rectangle|polygon|radius|vertices|fence"),
    ("number theory", r"divisi|remainder|prime|gcd|lcm|divisor|digit|modulo|integer|multiple"),
    ("algebra", r"equation|roots?\b|polynomial|solve|\$x|function|sequence|sum of the"),
)


class Math(Domain):
    validity_predicates = ("math_spec", "math_oracle")

    def __init__(
        self,
        pools: list[str] = ("grade_school", "competition", "olympiad"),
        user_pools: dict[str, str | dict[str, str]] | None = None,
        contexts_per_pool: int = 32,
        oracles: list[str | None] = (None, None),
        oracle_attempts: int = 2,
        oracle_backend: str = "transformers",
        oracle_sampling: dict[str, Any] | None = None,
        min_chars: int = 20,
        max_chars: int = 1500,
        verify_timeout: float = 10.0,
        seed: int = 0,
    ):
        unknown = [name for name in pools if name not in BUILTIN_POOLS]
        if unknown:
            raise ValueError(f"unknown built-in pool(s) {unknown}; built in: {', '.join(BUILTIN_POOLS)}")
        self.pools = {name: builtin_pool(name) for name in pools}
        # a user pool is a path, or {path, problem_key, answer_key} for files with other column names
        for name, spec in (user_pools or {}).items():
            self.pools[name] = load_pool(**spec) if isinstance(spec, dict) else load_pool(spec)
        if not self.pools:
            raise ValueError("no example pools: name built-in pools or user_pools")
        self.contexts_per_pool, self.seed = contexts_per_pool, seed
        self.oracles, self.oracle_attempts, self.oracle_backend = list(oracles), oracle_attempts, oracle_backend
        self.oracle_sampling = Sampling(
            **{"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 512, **(oracle_sampling or {})}
        )
        self.min_chars, self.max_chars = min_chars, max_chars
        self.verify_timeout = verify_timeout
        self._compared: dict[str, bool] = {}
        self._compared_lock = threading.Lock()

    # -- generation -------------------------------------------------------------------------------

    def contexts(self) -> list[Context]:
        rng = random.Random(self.seed)
        return [
            Context(id=f"math-{pool}-{i:03d}", data={"pool": pool, "examples": rng.sample(problems, 2)}, bucket=pool)
            for pool, problems in self.pools.items()
            for i in range(self.contexts_per_pool)
        ]

    def generator_prompt(self, context: Context) -> Messages:
        examples = "\n\n".join(f"Problem: {example['problem']}" for example in context.data["examples"])
        return [
            {
                "role": "user",
                "content": (
                    f"Here are two math problems.\n\n{examples}\n\nWrite one new problem of a similar style and "
                    "difficulty. It must ask exactly one question whose answer is a single number or expression. "
                    "Do not include the answer, hints or a solution."
                ),
            },
            {"role": "assistant", "content": "Problem:"},
        ]

    def parse(self, generation: str) -> dict[str, Any]:
        text = generation.split("Problem:", 1)[1] if "Problem:" in generation else generation
        end = SECTION_END.search(text)
        statement = (text[: end.start()] if end else text).strip()
        if not statement:
            raise ParseError("no problem statement")
        return {"problem": statement}

    def render(self, payload: dict[str, Any]) -> str:
        return f"Problem: {payload['problem']}"

    # -- solving ----------------------------------------------------------------------------------

    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        return [
            {
                "role": "user",
                "content": (
                    f"{payload['problem']}\n\nSolve the problem step by step and put the final answer in \\boxed{{}}."
                ),
            }
        ]

    @cached_property
    def verifier(self) -> Verifier:
        return Verifier(timeout=self.verify_timeout)

    def reference_compares(self, gold: str) -> bool:
        """Whether the verifier compares the reference answer with itself within its budget: when it
        does, a comparison that does not finish is the attempt's doing. A definite answer is
        remembered per reference; no answer (a worker that failed) is asked again next time."""
        with self._compared_lock:
            known = self._compared.get(gold)
        if known is None:
            equal = self.verifier.equal(gold, gold)
            if equal is None:
                return False
            known = equal
            with self._compared_lock:
                self._compared[gold] = known
        return known

    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        if "answer" not in payload:
            return Verdict(None, "the task has no reference answer (oracles did not agree)")
        answer = extract_answer(attempt)
        diagnostics = {"missing_answer": answer is None, "boxed": "\\boxed" in attempt}
        if answer is None:
            return Verdict(False, "no final answer", diagnostics)
        try:
            equal = self.verifier.equal(payload["answer"], answer)
            if equal is None and self.reference_compares(payload["answer"]):
                # the reference alone compares within the budget, so the answer is what the verifier
                # could not finish (a tower of powers, say): not solved, never a stall RL could learn
                return Verdict(False, f"the verifier gave no verdict on answer {answer[:60]!r} in time", diagnostics)
        except Overloaded as exc:  # the machine's doing: ungradable, and graded again
            return Verdict(None, str(exc), diagnostics)
        if equal is None:
            return Verdict(None, "the verifier did not answer (timeout or crash)", diagnostics)
        return Verdict(equal, None if equal else f"answer {answer[:60]!r} differs from the reference", diagnostics)

    def topic(self, payload: dict[str, Any]) -> str:
        text = payload["problem"].lower()
        return next((name for name, pattern in TOPICS if re.search(pattern, text)), "arithmetic")

    # -- the oracle policy ------------------------------------------------------------------------

    def oracle_answers(self, payload: dict[str, Any]) -> list[str | None]:
        """Each oracle's ``oracle_attempts`` final answers (None where an attempt gave none).

        Oracle backends come from the registry, so an oracle that is also the run's generator or
        solver model is loaded once.
        """
        answers = []
        for model in self.oracles:
            backend = self.registry.backend(ModelConfig(model=model, backend=self.oracle_backend))
            (attempts,) = backend.generate([self.solver_prompt(payload)], self.oracle_sampling, n=self.oracle_attempts)
            answers += [extract_answer(text) for text in attempts]
        return answers


def extract_answer(text: str) -> str | None:
    """The final answer, an expression rather than a digit inside one: the last \\boxed{...}, else the
    last 'Answer: ...' line, else the last math span ($...$, \\(...\\), \\[...\\]; the right-hand side
    of its last '=' when it has one), else the last number outside LaTeX. '\\$' is a dollar sign and
    dropped; thousands separators are dropped; a percent sign is kept, as '\\%'."""
    text = text.replace("\\$", "")
    boxed = _last_boxed(text)
    if boxed is not None:
        answer = boxed
    elif lines := ANSWER_LINE.findall(text):
        answer = _last_math(lines[-1]) or lines[-1].strip().rstrip(".")
    else:
        answer = _last_math(text) or _last_number(text)
    return PERCENT.sub(r"\\%", answer.strip()) if answer and answer.strip() else None


def _last_math(text: str) -> str | None:
    """The last math span's content, or the right-hand side of its last '=' (or \\approx)."""
    spans = [next(group for group in match.groups() if group is not None) for match in MATH_SPAN.finditer(text)]
    return RELATION.split(spans[-1])[-1].strip().rstrip(".") if spans else None


def _last_number(text: str) -> str | None:
    """The last number in a token with no LaTeX in it: '\\sqrt{2}', '2^{10}', '\\frac{1}{2}' hold none."""
    numbers = [number for token in text.split() if not LATEX.search(token) for number in NUMBER.findall(token)]
    return numbers[-1].replace(",", "") if numbers else None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i]
    return None  # unbalanced


def check_spec(task: Task, domain: Math) -> Validity:
    """Task specification rules: one clearly stated question, one final answer, nothing leaked."""
    problem = task.payload["problem"]
    if not domain.min_chars <= len(problem) <= domain.max_chars:
        return Validity.reject(f"length {len(problem)} outside {domain.min_chars}..{domain.max_chars} characters")
    if LEAK.search(problem):
        return Validity.reject("the statement leaks an answer or solution")
    if PROOF.search(problem):
        return Validity.reject("asks for a proof, not a single final answer")
    if PARTS.search(problem):
        return Validity.reject("has several parts, not a single final answer")
    if problem.count("?") > 1:
        return Validity.reject("asks more than one question")
    if not ASKS.search(problem):
        return Validity.reject("asks no question")
    return Validity.ok()


def check_oracle(task: Task, domain: Math) -> Validity:
    """The oracle policy: every oracle attempt must give the same answer, which becomes the reference.

    Disagreement or a missing answer leaves the task unscorable; it stays in tasks.jsonl with the reason.
    """
    answers = domain.oracle_answers(task.payload)
    task.payload["oracle_answers"] = answers
    if any(answer is None for answer in answers):
        return Validity.reject("unscorable: an oracle attempt gave no final answer")
    first = answers[0]
    for other in answers[1:]:
        equal = domain.verifier.equal(first, other)
        if equal is None:
            return Validity.reject("unscorable: the verifier did not answer comparing oracle answers")
        if not equal:
            shown = ", ".join(repr(a[:30]) for a in answers)
            return Validity.reject(f"unscorable: oracles disagree ({shown})")
    task.payload["answer"] = first
    return Validity.ok()
