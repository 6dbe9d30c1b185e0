"""``propel check``: a domain plugin's parts run on a few samples its author writes, before any model
loads, with one line per problem (and the concurrency check the executor's threads need).

A sample is one JSON object a line: ``generation`` (what a generator wrote, its prefill included),
and optionally ``attempts`` (solver answers to the task it parses to), ``valid`` (whether the task
should be valid) and ``solved`` (per attempt, whether it should be solved; ``null`` for ungradable).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from propel_core.domain import Domain, grade_attempt, make_task
from propel_core.errors import PropelError
from propel_core.records import Context

#: the contexts whose generator prompt is checked, at most
CONTEXTS_CHECKED = 64


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The samples of a JSONL file; a line that is not one refuses, naming it."""
    samples = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PropelError(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    for number, line in enumerate(text.splitlines(), 1):
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
        solved = sample.get("solved", [None] * len(attempts))
        if (
            not isinstance(solved, list)
            or len(solved) != len(attempts)
            or not all(s in (True, False, None) for s in solved)
        ):
            raise PropelError(f'{path} line {number}: "solved" has one true, false or null per attempt')
        if sample.get("valid") not in (True, False, None):
            raise PropelError(f'{path} line {number}: "valid" is true or false')
        samples.append(sample)
    if not samples:
        raise PropelError(f"{path} holds no sample")
    return samples


def check_domain(
    domain: Domain, predicates: dict, samples: list[dict[str, Any]], say: Callable[[str], None]
) -> list[str]:
    """Every problem found, a line each naming where: contexts and their generator prompts, each
    sample's parse, predicates and render against ``valid``, each attempt's verdict against
    ``solved``, a part that raised (or exited) where it should have said why, and verdicts that
    change when graded from many threads. What the domain made of each sample is ``say``-ed as it
    goes, so a grader that hangs shows where."""
    problems: list[str] = []
    contexts, raised = guarded(domain.contexts)
    if raised or not isinstance(contexts, list):
        problems.append(f"contexts(): {raised or f'returned {type(contexts).__name__}, not a list of contexts'}")
        contexts = []
    elif not contexts:
        problems.append("contexts(): no context; the generator needs at least one")
    ids = [getattr(context, "id", None) for context in contexts]
    if len(set(ids)) != len(ids):
        problems.append("contexts(): context ids repeat; each must be unique")
    for context in contexts[:CONTEXTS_CHECKED]:
        problems += [
            f"generator_prompt({context.id!r}): {p}" for p in message_problems(domain.generator_prompt, context)
        ]
    context = contexts[0] if contexts else Context(id="check", data={})
    graded: list[tuple[dict, str]] = []
    labels: list[str] = []
    for number, sample in enumerate(samples, 1):
        where = f"sample {number}"
        task, raised = guarded(make_task, f"check-{number}", domain, context, sample["generation"], "check", predicates)
        if raised:
            problems.append(f"{where}: {raised}")
            continue
        reason = task.validity.reason or ""
        if any(reason.startswith(f"{step} failed: ") for step in ("parse", "render", *domain.validity_predicates)):
            problems.append(f"{where}: {reason} (say why instead: parse raises ParseError, a predicate rejects)")
        expected = sample.get("valid")
        if expected is not None and expected != task.validity.valid:
            problems.append(f"{where}: expected {'valid' if expected else 'invalid'}, got {describe(task.validity)}")
        verdicts = []
        if task.validity.valid:
            problems += [f"{where}: solver_prompt: {p}" for p in message_problems(domain.solver_prompt, task.payload)]
            for index, text in enumerate(sample.get("attempts", [])):
                attempt, raised = guarded(grade_attempt, domain, task, text)
                if raised:
                    problems.append(f"{where} attempt {index + 1}: grade {raised}")
                    continue
                verdicts.append(attempt)
                graded.append((task.payload, text))
                labels.append(f"{where} attempt {index + 1}")
                if (attempt.reason or "").startswith("grader failed: "):
                    problems.append(f"{where} attempt {index + 1}: {attempt.reason}")
                want = sample["solved"][index] if "solved" in sample else attempt.solved
                if want != attempt.solved:
                    problems.append(
                        f"{where} attempt {index + 1}: expected {outcome(want)}, got {outcome(attempt.solved)}"
                        + (f" ({attempt.reason})" if attempt.reason else "")
                    )
        elif sample.get("attempts"):
            problems.append(f"{where}: has attempts, but its task is invalid ({task.validity.reason})")
        say(
            one_line(f"{where}: {describe(task.validity)}")
            + (f", topic {task.topic!r}" if task.validity.valid else "")
            + "".join(f"; attempt {i + 1}: {outcome(a.solved)}" for i, a in enumerate(verdicts))
        )
    problems += [
        f"{labels[i]}: graded from 8 threads at once {got}, one at a time {alone}: grade must share no state "
        "between calls"
        for i, alone, got in changed_verdicts(domain, graded)
    ]
    return [one_line(problem) for problem in problems]


def guarded(call: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """``call(*args)`` and None, or None and what it raised, as a line: an error or an exit (a part
    that calls ``sys.exit`` would end the check in silence)."""
    try:
        return call(*args), None
    except (Exception, SystemExit) as exc:
        return None, f"raised {type(exc).__name__}: {str(exc)[:200]}"


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as one space: a problem is one line."""
    return " ".join(str(text).split())


def message_problems(method: Callable[[Any], Any], argument: Any) -> list[str]:
    """Why what ``method(argument)`` returned is not a list of chat messages (role and content strings)."""
    messages, raised = guarded(method, argument)
    if raised:
        return [raised]
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
        found, raised = guarded(domain.grade, *attempts[index])
        return (None, raised) if raised else (getattr(found, "solved", None), getattr(found, "reason", None))

    serial = [verdict(i) for i in range(len(attempts))]
    order = [i for _ in range(rounds) for i in range(len(attempts))]
    random.Random(seed).shuffle(order)
    with ThreadPoolExecutor(threads) as pool:
        concurrent = list(pool.map(verdict, order))
    return [(i, serial[i], got) for i, got in zip(order, concurrent, strict=True) if got != serial[i]]
