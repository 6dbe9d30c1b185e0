"""What a stage gets: the validated config, the registry, its run folder, models and a progress bar."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from propel_core.backend import ModelBackend
from propel_core.config import PropelConfig, dump_config
from propel_core.domain import Domain
from propel_core.errors import PropelError
from propel_core.plugins import Registry

log = logging.getLogger("propel")


@dataclass
class Run:
    config: PropelConfig
    registry: Registry
    quiet: bool = False
    _domain: Domain | None = field(default=None, repr=False)
    _executor: Any = field(default=None, repr=False)

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

    def executor(self) -> Any:
        """The configured executor (``executor.name``), created on first use and shared by the run's stages."""
        if self._executor is None:
            executor = self.config.executor
            self._executor = self.component("executors", executor.name)(workers=executor.workers, **executor.options)
        return self._executor

    def component(self, kind: str, name: str) -> Any:
        return self.registry.get(kind, name)

    @contextlib.contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[..., None]]:
        """A progress bar (silent with ``-q``); yields ``advance(n, in_flight=None)``: ``n`` more done,
        and how many jobs are running now when the caller knows."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[running]}"), TimeRemainingColumn())  # fmt: skip
        with Progress(*columns, disable=self.quiet, transient=False) as bar:
            task = bar.add_task(description, total=total, running="")

            def advance(n: int = 1, in_flight: int | None = None) -> None:
                bar.update(task, advance=n, **({} if in_flight is None else {"running": f"{in_flight} in flight"}))

            yield advance
