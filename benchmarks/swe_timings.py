"""How long the SWE pipeline's sandboxed steps take on a real project: six 1.17.0 from its PyPI sdist.

Compares: nothing by default (the local sandbox alone: each step repeated, min and median printed);
with ``--docker-image``, the docker sandbox against the local one, step by step, interleaved.

Steps: preflight (the suite on the clean checkout); procedural bugs (mutation) and their verification,
each on the same distinct bugs in every arm; the verification of one valid bug again; a solver attempt
(a scripted solver that reverts the bug, 2 turns) and its grading; with ``--model-turns N``, an attempt
by the embedded model as the solver (N turns at most, the default solver sampling unless
``--model-tokens`` caps it). Each step has a warm-up call, then ``--repeats`` interleaved ones
(timing.compare).

    python benchmarks/swe_timings.py [--repeats 3] [--bugs 6] [--docker-image IMAGE] [--model-turns N]

``--docker-image`` names an image with bash, git and Python with pytest (``propel swe image``
builds one); six is copied into each container.

``--layers`` also times the verification of the valid bug and the grading of its revert with each
layer of the verdict switched off in turn (the guard, the second runner and its clock rechecks, the
screen, the replay; docs/swe.md, "Four layers"; and each test's own time limit), all arms
interleaved in one run: what each layer costs.
"""

import argparse
import itertools
import json
import statistics
import tempfile
from pathlib import Path

import yaml
from timing import compare, report

from propel_core.config import ModelConfig
from propel_core.embedded import cache_dir
from propel_core.errors import PropelError
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.records import Context
from propel_core.worker import model_reply
from propel_swe import verifier
from propel_swe.checkout import python_environment, sdist_checkout

CONTEXT = Context(id="six", data={"repo": "six"})


def step(what: str, arms: dict, repeats: int) -> dict[str, list[float]]:
    times = compare(arms, repeats=repeats, warmup=1)
    report(what, times, baseline=next(iter(arms)) if len(arms) > 1 else None)  # the first arm: local, all layers
    return times


def first_runner_again(ws, repo, tests, time_limit, shift_clock=0, guarding=None):
    """The second runner switched off: the first answers in its place."""
    suite = verifier.run_suite(ws, repo, time_limit, list(tests), guarding)
    return {test: suite.tests.get(test, f"no answer ({suite.status})") for test in tests}


def no_replay(*args, **kwargs):
    """The replay switched off: a bug records no calls, so its fix is judged without them."""
    raise PropelError("the replay is off")


#: arm -> the verifier's attributes replaced for it
LAYERS = {
    "all layers": {},
    "no guard": {"GUARD": verifier.INERT_GUARD},
    "no second runner": {"second_run": first_runner_again},
    "no screen": {"screen": lambda before, after, original=None: []},
    "no test time limits": {"time_limits": lambda baseline: {}},
    "no replay": {"record_calls": no_replay},
}


def without(changes: dict, call):
    """``call`` with the verifier's attributes in ``changes`` replaced, then put back."""

    def run():
        saved = {name: getattr(verifier, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(verifier, name, value)
            return call()
        finally:
            for name, value in saved.items():
                setattr(verifier, name, value)

    return run


def layer_costs(domain, valid: dict, revert: str, repeats: int) -> dict:
    """Seconds to verify ``valid`` and to grade its revert, all layers on and each off in turn."""
    attempt = json.dumps({"diff": revert, "status": "finished", "turns": []})
    verify = {arm: without(changes, lambda: domain.verify(dict(valid))) for arm, changes in LAYERS.items()}
    verified = step("verification of one valid bug, by layers", verify, repeats)
    grade = {arm: without(changes, lambda: domain.grade(valid, attempt)) for arm, changes in LAYERS.items()}
    graded = step("grading its exact revert, by layers", grade, repeats)
    return {
        "verification_median_s": {arm: statistics.median(times) for arm, times in verified.items()},
        "grading_median_s": {arm: statistics.median(times) for arm, times in graded.items()},
    }


def measure(domains: dict, args) -> dict:
    repo = next(iter(domains.values())).repos["six"]
    summary = {}
    baselines = {}

    def preflight(label):
        def run():
            baselines[label] = domains[label].baseline(repo, force=True)

        return run

    times = step("preflight: the suite once on the clean checkout", {k: preflight(k) for k in domains}, args.repeats)
    summary["preflight_s"] = {k: statistics.median(v) for k, v in times.items()}
    for label, found in baselines.items():
        print(f"  [{label}] {found.test_count} tests, suite {found.duration:.2f} s")

    # the same distinct bugs in every arm: bug number i is the i-th mutant of the order seeded 0
    payloads: dict[str, list[dict]] = {label: [] for label in domains}
    seeds = {label: itertools.count() for label in domains}

    def mutate(label):
        def run():
            domain = domains[label]
            payloads[label].append(domain.parse(domain.episode(CONTEXT, None, seed=next(seeds[label]))))

        return run

    step("procedural bug: one mutation (a new bug each call)", {k: mutate(k) for k in domains}, args.bugs)
    verdicts: dict[str, list[bool]] = {label: [] for label in domains}
    queue = {label: iter(found) for label, found in payloads.items()}

    def verify(label):
        def run():
            verdicts[label].append(domains[label].verify(next(queue[label])).valid)

        return run

    times = step(
        "verification of a procedural bug (a new bug each call)",
        {k: verify(k) for k in domains},
        len(payloads["local"]) - 1,
    )
    summary["verification_median_s"] = {k: statistics.median(v) for k, v in times.items()}
    for label, found in verdicts.items():
        print(f"  [{label}] valid: {sum(found)} of {len(found)} bugs")
    local = domains["local"]
    valid = next((p for p, ok in zip(payloads["local"], verdicts["local"], strict=True) if ok), None)
    for seed in range(len(payloads["local"]), 40) if valid is None else ():  # look further, untimed
        payload = local.parse(local.episode(CONTEXT, None, seed=seed))
        if local.verify(payload).valid:
            valid = payload
            break
    if valid is None:
        print("no valid bug among the first 40 mutants: no solver timings")
        return summary

    times = step(
        "verification of one valid bug, again",
        {k: (lambda d=d: d.verify(dict(valid))) for k, d in domains.items()},
        args.repeats,
    )
    revert = f"```bash\ncat > /tmp/bug.diff <<'PATCH'\n{valid['diff']}PATCH\ngit apply -R /tmp/bug.diff\n```"
    attempts: dict[str, str] = {}

    def attempt(label, reply_of):
        def run():
            attempts[label] = domains[label].solver_episode(valid, reply_of())

        return run

    def scripted():
        replies = iter([revert, "```submit\n```"])
        return lambda messages: next(replies)

    times = step(
        "solver attempt: a scripted solver reverts the bug (2 turns)",
        {k: attempt(k, scripted) for k in domains},
        args.repeats,
    )
    summary["solver_attempt_s"] = {k: statistics.median(v) for k, v in times.items()}
    solved: dict[str, object] = {}

    def grade(label):
        def run():
            solved[label] = domains[label].grade(valid, attempts[label]).solved

        return run

    times = step("grading that attempt on a clean checkout", {k: grade(k) for k in domains}, args.repeats)
    summary["grading_s"] = {k: statistics.median(v) for k, v in times.items()}
    print(f"  solved: {solved}")
    if args.layers:
        summary["layers"] = layer_costs(local, valid, json.loads(attempts["local"])["diff"], args.repeats)

    if args.model_turns:  # the embedded model as the solver: what a real attempt costs per turn here
        sampling = validate_config({"domain": {"name": "swe"}}, local.registry).solver.sampling
        if args.model_tokens:
            sampling = sampling.model_copy(update={"max_new_tokens": args.model_tokens})
        backend = local.registry.backend(ModelConfig())
        calls = itertools.count()
        for domain in domains.values():
            domain.solver_max_turns = args.model_turns

        def by_model():
            return model_reply(backend.generate, sampling, seed=next(calls))

        what = f"embedded-model solver attempt (<= {args.model_turns} turns of <= {sampling.max_new_tokens} tokens"
        times = step(f"{what}, a new seed each call)", {k: attempt(k, by_model) for k in domains}, args.repeats)
        for label, text in attempts.items():
            print(f"  [{label}] last attempt: {len(json.loads(text).get('turns', []))} turns")
        summary["model_attempt_s"] = {k: statistics.median(v) for k, v in times.items()}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bugs", type=int, default=6, help="distinct procedural bugs mutated and verified (timed)")
    parser.add_argument("--docker-image", help="also measure the docker sandbox with this base image")
    parser.add_argument("--model-turns", type=int, default=0, help="also time an embedded-model solver attempt")
    parser.add_argument("--model-tokens", type=int, default=0, help="cap its new tokens a turn (0: solver default)")
    parser.add_argument("--layers", action="store_true", help="also time each layer of the verdict switched off")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        six = sdist_checkout("six==1.17.0", cache_dir() / "swe" / "sdists", folder)
        env = python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
        registry_file = folder / "repos.yaml"
        registry_file.write_text(yaml.safe_dump({"repos": [{"name": "six", "path": str(six)}]}))
        registry = Registry.build()
        options = {"registry": str(registry_file), "generator": "procedural"}
        local = {"time_limit": 120, "memory_mb": 2048, "max_processes": 64, "python_env": str(env)}
        domains = {
            "local": registry.domain(
                "swe", **options, preflight_dir=str(folder / "preflight-local"), sandbox="local", sandbox_options=local
            )
        }
        if args.docker_image:
            docker = {"base_image": args.docker_image, "disk_gb": None}
            domains["docker"] = registry.domain(
                "swe",
                **options,
                preflight_dir=str(folder / "preflight-docker"),
                sandbox="docker",
                sandbox_options=docker,
            )
        print(f"six 1.17.0, sandboxes: {', '.join(domains)}; {args.repeats} repeats a step after a warm-up call")
        print(json.dumps(measure(domains, args)))


if __name__ == "__main__":
    main()
