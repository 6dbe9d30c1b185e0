"""What a stage gets: the validated config, the registry, its run folder, models, an executor, a
progress bar and the channel for what it tells the user.

Stages read ``run.config``; the library they call (execution, training, probes, evaluation, ...) takes
a ``Run`` only for these services and gets every setting as an argument, so a caller that needs
another value (evaluation's seed and K, co-evolution's reward rule) passes it instead of forging a
config. Plugin commands build their run with :func:`start_run`, as the CLI's verbs do.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from propel_core.backend import ModelBackend
from propel_core.config import ModelConfig, PropelConfig, dump_config, load_config
from propel_core.contracts import ContextSampler, Executor
from propel_core.domain import Domain
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.provenance import claim
from propel_core.tracking import Tracker

if TYPE_CHECKING:
    from propel_core.execution import Worker

log = logging.getLogger("propel")


@dataclass
class Run:
    config: PropelConfig
    registry: Registry
    quiet: bool = False
    _domain: Domain | None = field(default=None, init=False, repr=False)
    _executor: Executor | None = field(default=None, init=False, repr=False)
    _tracker: Tracker | None = field(default=None, init=False, repr=False)

    @property
    def dir(self) -> Path:
        return self.config.run_dir

    def input(self, name: str, made_by: str) -> Path:
        """A file an earlier stage writes into the run folder; missing, it names the stage to run."""
        path = self.dir / name
        if not path.exists():
            raise PropelError(f"{path} does not exist: run `propel {made_by}` first")
        return path

    def save_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(dump_config(self.config))

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
        generate = self.config.generate
        return self.registry.context_sampler(
            generate.context_sampler, self.domain().contexts(), seed, **generate.sampler_options
        )

    def worker(self, model: ModelConfig) -> Worker:
        """What a job of this run runs with: the domain and ``model`` with its sampling."""
        from propel_core.execution import Worker

        return Worker(self.config.domain, model, model.sampling, self.registry, self.domain())

    def component(self, kind: str, name: str) -> Any:
        return self.registry.get(kind, name)

    @property
    def tracker(self) -> Tracker:
        """The trackers of ``report_to``, for the numbers and tables a stage measures."""
        if self._tracker is None:
            self._tracker = Tracker(self.config.report_to, self.dir)
        return self._tracker

    def track(self, stage: str, metrics: dict[str, Any], step: int = 0) -> None:
        """Log a stage's numbers to every tracker of ``report_to`` (nothing with ``none``)."""
        self.tracker.log(stage, metrics, step)

    def claim(self, output: str, exists: bool) -> None:
        """Before a stage adds to ``output`` (a file or folder of the run, holding records when
        ``exists``): refuse if it was made with other settings, and record the ones used now."""
        claim(self.dir, output, self.config.model_dump(mode="json"), exists, self.config.allow_changed_settings)

    def say(self, text: str) -> None:
        """Tell the user what a stage found (its summary, table or verdict): on standard output, also
        with ``-q``, which silences only progress (bars and ``log`` messages)."""
        click.echo(text)

    @contextlib.contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """A progress bar (silent with ``-q``); yields ``advance(n, in_flight=None)``: ``n`` more done,
        and how many jobs are running now when the caller knows."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[running]}"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, disable=self.quiet, transient=False) as bar:
            task = bar.add_task(description, total=total, running="")

            def advance(n: int = 1, in_flight: int | None = None) -> None:
                bar.update(task, advance=n, **({} if in_flight is None else {"running": f"{in_flight} in flight"}))

            yield advance


def start_run(
    configs: list[str | Path], overrides: list[str] = (), quiet: bool = False, registry: Registry | None = None
) -> Run:
    """The run a command works in: ``configs`` merged with ``key=value`` ``overrides``, validated
    against the installed plugins, its folder made and its resolved config saved there. The CLI's
    verbs and plugin commands (``propel swe preflight``) start this way."""
    registry = registry or Registry.build()
    run = Run(load_config([str(path) for path in configs], list(overrides), registry), registry, quiet=quiet)
    run.tracker  # noqa: B018  (a tracker that is not installed stops the command now, not after its work)
    run.save_config()
    return run
