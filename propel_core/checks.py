"""``propel check``: a domain plugin's parts run on a few samples its author writes, before any model
loads, with one line per problem (and the concurrency check the executor's threads need).

A sample is one JSON object a line: ``generation`` (what a generator wrote, its prefill included),
and optionally ``attempts`` (solver answers to the task it parses to), ``valid`` (whether the task
should be valid) and ``solved`` (per attempt, whether it should be solved; ``null`` for ungradable).
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from propel_core.domain import Domain, Verdict, grade_attempt, make_task
from propel_core.errors import PropelError
from propel_core.records import Context

#: the contexts whose generator prompt is checked, at most
CONTEXTS_CHECKED = 64


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The samples of a JSONL file; a line that is not one refuses, naming it."""
    samples = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except ValueError as exc:
            raise PropelError(f"{path} line {number} is not JSON: {exc}") from None
        if not isinstance(sample, dict) or not isinstance(sample.get("generation"), str):
            raise PropelError(f'{path} line {number}: a sample is an object with a "generation" string')
        attempts = sample.get("attempts", [])
        if not isinstance(attempts, list) or not all(isinstance(a, str) for a in attempts):
            raise PropelError(f'{path} line {number}: "attempts" is a list of strings')
        solved = sample.get("solved")
        if solved is not None and (not isinstance(solved, list) or len(solved) != len(attempts)):
            raise PropelError(f'{path} line {number}: "solved" has one true, false or null per attempt')
        samples.append(sample)
    if not samples:
        raise PropelError(f"{path} holds no sample")
    return samples


def check_domain(domain: Domain, predicates: dict, samples: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """What the domain made of each sample (lines to show) and every problem found (lines to show,
    each naming where): contexts and their generator prompts, each sample's parse, predicates,
    render and topic against ``valid``, each attempt's verdict against ``solved``, a part that raised
    where it should have said why, and verdicts that change when graded from many threads."""
    problems: list[str] = []
    contexts = domain.contexts()
    if not contexts:
        problems.append("contexts(): no context; the generator needs at least one")
    ids = [context.id for context in contexts]
    if len(set(ids)) != len(ids):
        problems.append("contexts(): context ids repeat; each must be unique")
    for context in contexts[:CONTEXTS_CHECKED]:
        problems += [
            f"generator_prompt({context.id!r}): {p}" for p in message_problems(domain, "generator_prompt", context)
        ]
    context = contexts[0] if contexts else Context(id="check", data={})
    shown: list[str] = []
    graded: list[tuple[dict, str]] = []
    labels: list[str] = []
    for number, sample in enumerate(samples, 1):
        task = make_task(f"check-{number}", domain, context, sample["generation"], "check", predicates)
        where = f"sample {number}"
        reason = task.validity.reason or ""
        if any(reason.startswith(f"{step} failed: ") for step in ("parse", "render", *domain.validity_predicates)):
            problems.append(f"{where}: {reason} (raise ParseError, or return Validity.reject, with the reason)")
        expected = sample.get("valid")
        if expected is not None and expected != task.validity.valid:
            problems.append(f"{where}: expected {'valid' if expected else 'invalid'}, got {describe(task.validity)}")
        verdicts = []
        if task.validity.valid:
            problems += [
                f"{where}: solver_prompt: {p}" for p in message_problems(domain, "solver_prompt", task.payload)
            ]
            if not isinstance(task.text, str | list):
                problems.append(f"{where}: render returned {type(task.text).__name__}, not text")
            for index, text in enumerate(sample.get("attempts", [])):
                attempt = grade_attempt(domain, task, text)
                verdicts.append(attempt)
                graded.append((task.payload, text))
                labels.append(f"{where} attempt {index + 1}")
                if (attempt.reason or "").startswith("grader failed: "):
                    problems.append(f"{where} attempt {index + 1}: {attempt.reason}")
                want = (sample.get("solved") or [None] * len(sample["attempts"]))[index]
                if "solved" in sample and want != attempt.solved:
                    problems.append(
                        f"{where} attempt {index + 1}: expected {outcome(want)}, got {outcome(attempt.solved)}"
                        + (f" ({attempt.reason})" if attempt.reason else "")
                    )
        elif sample.get("attempts"):
            problems.append(f"{where}: has attempts, but its task is invalid ({task.validity.reason})")
        shown.append(
            f"{where}: {describe(task.validity)}"
            + (f", topic {task.topic!r}" if task.validity.valid else "")
            + "".join(f"; attempt {i + 1}: {outcome(a.solved)}" for i, a in enumerate(verdicts))
        )
    problems += [
        f"{labels[i]}: graded from 8 threads at once {got}, one at a time {alone}: grade must share no state "
        "between calls"
        for i, alone, got in changed_verdicts(domain, graded)
    ]
    return shown, problems


def message_problems(domain: Domain, method: str, argument: Any) -> list[str]:
    """Why what ``method`` returned is not a list of chat messages (role and content strings)."""
    try:
        messages = getattr(domain, method)(argument)
    except Exception as exc:
        return [f"raised {type(exc).__name__}: {str(exc)[:200]}"]
    if not isinstance(messages, list) or not messages:
        return [f"returned {type(messages).__name__}, not a non-empty list of messages"]
    wrong = [
        i
        for i, m in enumerate(messages)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str)
    ]
    return [f"message {i + 1} is not {{'role': str, 'content': str}}" for i in wrong[:3]]


def describe(validity) -> str:
    return "valid" if validity.valid else f"invalid ({validity.reason})"


def outcome(solved: bool | None) -> str:
    return {True: "solved", False: "not solved", None: "ungradable"}[solved]


def changed_verdicts(
    domain: Domain, attempts: list[tuple[dict, str]], threads: int = 8, rounds: int = 2, seed: int = 0
) -> list[tuple[int, Any, Any]]:
    """``(index, verdict one at a time, verdict in threads)`` for each grading of an attempt whose
    verdict (solved, reason) changed when every one was graded ``rounds`` times over from ``threads``
    threads at once, in an order shuffled by ``seed``: the executor calls a domain's grader from many
    threads, so grade must share no state between calls."""

    def verdict(index: int) -> tuple[bool | None, str | None]:
        try:
            found = domain.grade(*attempts[index])
        except Exception as exc:
            return None, f"raised {type(exc).__name__}"
        return (found.solved, found.reason) if isinstance(found, Verdict) else (None, repr(found)[:80])

    serial = [verdict(i) for i in range(len(attempts))]
    order = [i for _ in range(rounds) for i in range(len(attempts))]
    random.Random(seed).shuffle(order)
    with ThreadPoolExecutor(threads) as pool:
        concurrent = list(pool.map(verdict, order))
    return [(i, serial[i], got) for i, got in zip(order, concurrent, strict=True) if got != serial[i]]
