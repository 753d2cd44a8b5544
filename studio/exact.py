"""The exact acceptance-against-budget curve of each session's last greedy run, replayed in one background thread
(`core.replay`). It waits before every replayed step while any run decodes, so no run waits for it and no run's
output is delayed; a session's newer run supersedes its older curve, which stops at its next step. The page polls
with a timer and draws the points as they come. `shutdown` stops the worker before the interpreter finalises: a
daemon thread caught inside a torch operator then would abort the process.
"""
from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from core.config import DecodeConfig
from core.replay import exact_budget_points

MAX_JOBS = 32             # curves kept at once (a session keeps its latest); the oldest are dropped beyond it


class Superseded(Exception):
    """Raised inside a replay whose session has started another run (or left)."""


@dataclass
class Job:
    id: int
    pair: object
    prompt_ids: list[int]
    reply: list[int]
    cfg: DecodeConfig
    budgets: list[int]
    points: dict[int, float] = field(default_factory=dict)   # budget -> exact τ, in the order they finish
    error: str | None = None
    cancelled: bool = False
    shown: tuple = ()         # what the page last drew (points, done): the timer redraws only on news

    @property
    def done(self) -> bool:
        return self.error is not None or len(self.points) == len(self.budgets)


class ExactCurves:
    """Jobs by id (the session state holds the id), each session's latest, and the worker that replays them in
    turn. `idle()` blocks while a run decodes."""

    def __init__(self, idle: Callable[[], None]):
        self.idle = idle
        self.jobs: dict[int, Job] = {}
        self.latest: dict[str, int] = {}
        self._ids, self._queue, self._lock, self._worker = itertools.count(1), queue.Queue(), threading.Lock(), None

    def start(self, session: str, pair, prompt_ids: list[int], reply: list[int], cfg: DecodeConfig,
              budgets: list[int]) -> Job:
        """Queue this session's curve (superseding its previous one) and return its job."""
        self.cancel(session)
        job = Job(next(self._ids), pair, list(prompt_ids), list(reply), cfg, list(budgets))
        with self._lock:
            self.jobs[job.id], self.latest[session] = job, job.id
            while len(self.jobs) > MAX_JOBS:
                self.jobs.pop(next(iter(self.jobs))).cancelled = True
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, daemon=True, name="exact-curves")
                self._worker.start()
        self._queue.put(job)
        return job

    def cancel(self, session: str) -> None:
        """Stop and forget this session's curve (a newer run, a replaced view or a closed tab)."""
        with self._lock:
            job = self.jobs.pop(self.latest.pop(session, None), None)
        if job is not None:
            job.cancelled = True

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait (up to `timeout` s) for the worker to leave its current replayed step."""
        with self._lock:
            for job in self.jobs.values():
                job.cancelled = True
            worker = self._worker
        if worker is not None:
            self._queue.put(None)
            worker.join(timeout)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled:
                continue
            try:
                for budget, tau in exact_budget_points(job.pair, job.prompt_ids, job.reply, job.cfg, job.budgets,
                                                       pause=lambda: self._pause(job)):
                    job.points[budget] = tau
            except Superseded:
                pass
            except Exception as e:  # noqa: BLE001 - a failed curve is said on its chart, never the app down
                job.error = f"{type(e).__name__}: {e}"

    def _pause(self, job: Job) -> None:
        self.idle()
        if job.cancelled:
            raise Superseded
