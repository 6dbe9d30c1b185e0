"""How long the SWE pipeline's sandboxed steps take on a real project: six 1.17.0 from its PyPI
sdist, in the local sandbox (and in the docker sandbox when an engine is reachable, side by side).

Prints: preflight (the suite once on the clean checkout), one procedural bug, one verification of a
valid bug, one solver attempt (a scripted solver that reverts the bug) and its grading; with
``--model-turns N``, one attempt by the embedded model as the solver (N turns at most).

    python benchmarks/swe_timings.py [--docker-image IMAGE] [--model-turns N]

``--docker-image`` names an image with bash, git and Python with pytest (``propel swe image``
builds one); six is copied into each container.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from propel_core.config import ModelConfig, Sampling
from propel_core.embedded import cache_dir
from propel_core.execution import model_reply
from propel_core.plugins import Registry
from propel_core.records import Context
from propel_swe.checkout import python_environment, sdist_checkout


def timed(action):
    started = time.monotonic()
    result = action()
    return result, time.monotonic() - started


def measure(domain, label: str, model_turns: int = 0) -> None:
    repo = domain.repos["six"]
    baseline, preflight_s = timed(lambda: domain.baseline(repo, force=True))
    print(f"[{label}] preflight: {preflight_s:.2f} s ({baseline.test_count} tests, suite {baseline.duration:.2f} s)")
    context = Context(id="six", data={"repo": "six"})
    generated, verified, valid = [], [], None
    for seed in range(40):
        payload, seconds = timed(lambda seed=seed: domain.parse(domain.episode(context, None, seed=seed)))
        generated.append(seconds)
        validity, seconds = timed(lambda payload=payload: domain.verify(payload))
        verified.append(seconds)
        if validity.valid:
            valid = payload
            break
    print(f"[{label}] procedural bug: median {statistics.median(generated):.2f} s; verification: median "
          f"{statistics.median(verified):.2f} s over {len(verified)} bugs, valid after {len(verified)}")  # fmt: skip
    if valid is None:
        return
    revert = f"```bash\ncat > /tmp/bug.diff <<'PATCH'\n{valid['diff']}PATCH\ngit apply -R /tmp/bug.diff\n```"
    replies = iter([revert, "```submit\n```"])
    attempt, attempt_s = timed(lambda: domain.solver_episode(valid, lambda messages: next(replies)))
    verdict, grade_s = timed(lambda: domain.grade(valid, attempt))
    print(f"[{label}] solver attempt (2 turns): {attempt_s:.2f} s; grading: {grade_s:.2f} s; solved {verdict.solved}")
    if model_turns:  # the embedded model as the solver: what a real attempt costs per turn here
        backend = domain.registry.backend(ModelConfig())
        reply = model_reply(
            backend.generate, Sampling(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=128), seed=0
        )
        domain.solver_max_turns = model_turns
        attempt, attempt_s = timed(lambda: domain.solver_episode(valid, reply))
        turns = len(json.loads(attempt)["turns"])
        verdict, grade_s = timed(lambda: domain.grade(valid, attempt))
        print(f"[{label}] embedded-model solver attempt: {attempt_s:.1f} s for {turns} turns of <= 128 tokens "
              f"({attempt_s / turns:.1f} s a turn); grading {grade_s:.2f} s; solved {verdict.solved}")  # fmt: skip
    print(json.dumps({"label": label, "preflight_s": preflight_s, "verification_median_s": statistics.median(verified),
                      "solver_attempt_s": attempt_s, "grading_s": grade_s}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docker-image", help="also measure the docker sandbox with this base image")
    parser.add_argument("--model-turns", type=int, default=0, help="also time an embedded-model solver attempt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        six = sdist_checkout("six==1.17.0", cache_dir() / "swe" / "sdists", folder)
        env = python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
        registry_file = folder / "repos.yaml"
        registry_file.write_text(yaml.safe_dump({"repos": [{"name": "six", "path": str(six)}]}))
        registry = Registry.build()
        options = {"registry": str(registry_file), "preflight_dir": str(folder / "preflight")}
        options["generator"] = "procedural"
        local = {"time_limit": 120, "memory_mb": 2048, "max_processes": 64, "python_env": str(env)}
        measure(registry.domain("swe", **options, sandbox="local", sandbox_options=local), "local", args.model_turns)
        if args.docker_image:
            docker = {"base_image": args.docker_image, "disk_gb": None}
            measure(registry.domain("swe", **options, sandbox="docker", sandbox_options=docker), "docker")


if __name__ == "__main__":
    main()
