"""What a stage gets: the validated config, the registry, its run folder, models, an executor, a
progress bar and the channel for what it tells the user.

Stages read ``run.config``; the library they call (execution, training, probes, evaluation, ...) never
sees the ``Run``: it takes ``run.services`` (:class:`~propel_core.services.Services`, no config) and a
plan (``run.plans``, :mod:`propel_core.plans`), every setting of the call in it, derived ones included
(evaluation's seed and K, co-evolution's reward rule) and checked when the config was read. A caller
that needs another folder or seed builds its plan with the same builder. Plugin commands build their
run with :func:`start_run`, as the CLI's verbs do; it holds the run folder for the command
(:mod:`propel_core.folder_lock`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import click

from propel_core.backend import ModelBackend
from propel_core.config import ModelConfig, PropelConfig, dump_config, spelled_out
from propel_core.contracts import ContextSampler, Executor
from propel_core.domain import Domain
from propel_core.errors import PropelError
from propel_core.folder_lock import hold, release
from propel_core.plans import Plans, load_config, plans_of, sampler_plan
from propel_core.plugins import Registry
from propel_core.provenance import claim
from propel_core.ranks import gathered, is_main, join, launch_warning
from propel_core.records import readable
from propel_core.services import Services
from propel_core.tracking import Tracker
from propel_core.worker import Worker

log = logging.getLogger("propel")


@dataclass
class Run:
    config: PropelConfig
    registry: Registry
    quiet: bool = False
    #: ``--redo-ungradable``: label and evaluate grade again the attempts their files hold as ungradable
    redo_ungradable: bool = False
    #: one line per stage of this command that finished with ungradable attempts (the CLI then exits 3)
    ungradable: list[str] = field(default_factory=list, init=False, repr=False)
    #: the kinds of ungradable attempt met so far: the first of each is logged, the others counted
    ungradable_kinds: set[str] = field(default_factory=set, init=False, repr=False)
    _domain: Domain | None = field(default=None, init=False, repr=False)
    _executor: Executor | None = field(default=None, init=False, repr=False)
    _tracker: Tracker | None = field(default=None, init=False, repr=False)

    @property
    def dir(self) -> Path:
        return self.config.run_dir

    def release(self) -> None:
        """Let go of the run folder, which :func:`start_run` took for this process: the CLI does at the
        end of each command; a script may, to let a command work there while it goes on."""
        release(self.dir)

    def input(self, name: str, made_by: str) -> Path:
        """A file an earlier stage writes into the run folder; missing, it names the stage to run."""
        path = self.dir / name
        if not path.exists():
            raise PropelError(f"{path} does not exist: run `propel {made_by}` first")
        return path

    def save_config(self) -> None:
        """Write the resolved config to ``config.yaml`` as ``propel config`` prints it (components'
        defaults, and what registered each); the main process of a launch alone."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if is_main():
            (self.dir / "config.yaml").write_text(dump_config(self.config, self.registry))

    def backend(self, role: str) -> ModelBackend:
        """The backend of one model role, loaded on first use; roles naming the same model share it."""
        model = getattr(self.config, role)
        log.info("%s model: %s", role, model.model or "embedded default")
        return self.registry.backend(model)

    def domain(self) -> Domain:
        if self._domain is None:
            self._domain = self.registry.domain(self.config.domain.name, **self.config.domain.options)
        return self._domain

    def executor(self) -> Executor:
        """The configured executor (``executor.name``), created on first use and shared by the run's stages."""
        if self._executor is None:
            executor = self.config.executor
            self._executor = self.registry.executor(executor.name, executor.workers, **executor.options)
        return self._executor

    def context_sampler(self, seed: int) -> ContextSampler:
        """A fresh sampler of the configured kind (``generate.context_sampler``) over the domain's
        contexts, seeded ``seed``."""
        return sampler_plan(self.config, seed).sampler(self.services)

    @cached_property
    def plans(self) -> Plans:
        """What this run's config plans for each library entry point (``propel_core.plans``)."""
        return plans_of(self.config)

    def worker(self, model: ModelConfig) -> Worker:
        """What a job of this run runs with: the domain and ``model`` with its sampling."""
        return Worker(self.config.domain, model, model.sampling, self.registry, self.domain())

    def component(self, kind: str, name: str) -> Any:
        return self.registry.get(kind, name)

    @cached_property
    def services(self) -> Services:
        """What the library gets from this run (no config): its registry, folder, domain, executor,
        workers, trackers, progress bars, ``say`` and its ungradable attempts."""
        return Services(
            self.registry,
            self.dir,
            self.domain,
            self.executor,
            self.worker,
            lambda: self.tracker,
            self.track,
            self.progress,
            self.say,
            self.quiet,
            self.ungradable,
            self.ungradable_kinds,
        )

    @property
    def tracker(self) -> Tracker:
        """The trackers of ``report_to``, for the numbers and tables a stage measures."""
        if self._tracker is None:
            self._tracker = Tracker(self.config.report_to, self.dir)
        return self._tracker

    def track(self, stage: str, metrics: dict[str, Any], step: int = 0) -> None:
        """Log a stage's numbers to every tracker of ``report_to`` (nothing with ``none``; the main
        process of a launch alone)."""
        if is_main():
            self.tracker.log(stage, metrics, step)

    def claim(
        self, output: str, exists: bool, more_keys: tuple[str, ...] = (), values: dict[str, Any] | None = None
    ) -> None:
        """Before a stage adds to ``output`` (a file or folder of the run, holding records when
        ``exists``): refuse if it was made with other settings, and record the ones used now (with the
        config keys and values the stage adds; see :func:`propel_core.provenance.claim`). The main
        process of a launch claims for all: the others would rewrite its record."""
        if not is_main():
            return
        config, added = spelled_out(self.config, self.registry)
        claim(self.dir, output, config, exists, self.config.allow_changed_settings, more_keys, values, frozenset(added))

    def say(self, text: str) -> None:
        """Tell the user what a stage found (its summary, table or verdict): on standard output, also
        with ``-q``, which silences only progress (bars and ``log`` messages). Under a launch of several
        processes the main one says it, from what all of them did."""
        if is_main():
            click.echo(readable(text))

    @contextlib.contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """A progress bar on standard error (silent with ``-q``); yields ``advance(n, in_flight=None)``:
        ``n`` more done, and how many jobs are running now when the caller knows (or, as a string, what
        runs now: a training's step and phase). Where standard error
        is not a terminal (``| tee``, CI, a log file), a plain line every ``progress_interval()``
        seconds and one at the end go to the ``propel`` log instead."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        if not self.quiet and not console.is_terminal:
            with progress_lines(description, total, progress_interval()) as advance:
                yield advance
            return
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[running]}"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, disable=self.quiet, transient=False) as bar:
            task = bar.add_task(description, total=total, running="")

            def advance(n: int = 1, in_flight: int | None = None) -> None:
                bar.update(task, advance=n, **({} if in_flight is None else {"running": _in_flight(in_flight)}))

            yield advance


#: seconds between two plain progress lines (standard error not a terminal); the environment variable
#: PROPEL_PROGRESS_INTERVAL overrides it
PROGRESS_INTERVAL = 10.0


def progress_interval() -> float:
    value = os.environ.get("PROPEL_PROGRESS_INTERVAL", "")
    try:
        return float(value) if value else PROGRESS_INTERVAL
    except ValueError:
        raise PropelError(f"PROPEL_PROGRESS_INTERVAL={value!r} is not a number of seconds") from None


def _in_flight(in_flight: int | str) -> str:
    """What a progress bar says runs now: a count of jobs in flight, or the caller's own words."""
    return in_flight if isinstance(in_flight, str) else f"{in_flight} in flight"


@contextlib.contextmanager
def progress_lines(description: str, total: int, interval: float) -> Iterator[Callable[..., None]]:
    """Progress as log lines, for a log or a pipe: every ``interval`` seconds (from a thread, so a line
    comes even while no job finishes) and once at the end, ``DESCRIPTION: done/total done, N in
    flight, R/s``. The rate is measured from the first ``advance`` on, so what an earlier run had
    done (the callers' first ``advance``) does not count."""
    opened = time.monotonic()
    state: dict[str, Any] = {"done": 0, "in_flight": None, "first": None}  # first: (time, done) after it
    lock = threading.Lock()

    def line(last: bool = False) -> None:
        now = time.monotonic()
        with lock:
            done, in_flight, first = state["done"], state["in_flight"], state["first"]
        parts = [f"{description}: {done}/{total} done"]
        if in_flight is not None and not last:
            parts.append(_in_flight(in_flight))
        if first is not None and done > first[1] and now > first[0]:
            parts.append(f"{(done - first[1]) / (now - first[0]):.2f}/s")
        if last:
            parts.append(f"{now - opened:.0f} s")
        log.info(", ".join(parts))

    def advance(n: int = 1, in_flight: int | None = None) -> None:
        with lock:
            state["done"] += n
            if in_flight is not None:
                state["in_flight"] = in_flight
            if state["first"] is None:
                state["first"] = (time.monotonic(), state["done"])

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval):
            line()

    ticker = threading.Thread(target=tick, name="propel-progress", daemon=True)
    ticker.start()
    try:
        yield advance
    finally:
        stop.set()
        ticker.join()
        line(last=True)


def start_run(
    configs: list[str | Path], overrides: list[str] = (), quiet: bool = False, registry: Registry | None = None
) -> Run:
    """The run a command works in: ``configs`` merged with ``key=value`` ``overrides``, validated
    against the installed plugins, its folder made and held (one command at a time: another one there
    is refused in one line naming it, before anything is written or loaded) and its resolved config
    saved there. The CLI's verbs and plugin commands (``propel swe preflight``) start this way. Under
    ``accelerate launch`` the process joins the launch's group first (:mod:`propel_core.ranks`)."""
    join()
    if (warning := launch_warning()) is not None:
        log.warning("%s", warning)
    registry = registry or Registry.build()
    run = Run(load_config([str(path) for path in configs], list(overrides), registry), registry, quiet=quiet)
    hold_folder(run.dir)
    run.tracker  # noqa: B018  (a tracker that is not installed stops the command now, not after its work)
    run.save_config()
    return run


def hold_folder(run_dir: Path) -> None:
    """Hold ``run_dir`` for this command (:func:`propel_core.folder_lock.hold`). The processes of a
    launch are one command: the main one holds it for all, and all of them refuse what it refuses."""
    refusal = None
    if is_main():
        try:
            hold(run_dir)
        except PropelError as exc:
            refusal = str(exc)
    if (refusal := gathered(refusal)[0]) is not None:
        raise PropelError(refusal)
