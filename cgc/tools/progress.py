"""How ``cgc train`` shows its steps: a one-line bar on a terminal (step/steps, loss, time
left), a line per step otherwise (a log keeps every loss)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

WIDTH = 24
"""Characters of the bar itself."""


def step_line(metrics: dict) -> str:
    """A step's line in a log: its number, its loss and the held-out loss if measured."""
    held_out = f", eval loss {metrics['eval_loss']:.6f}" if "eval_loss" in metrics else ""
    return f"step {metrics['step']}: loss {metrics['loss']:.6f}{held_out}"


def duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:02d}:{seconds:02d}"


class ProgressBar:
    """A bar redrawn in place after each step. It starts where the first step it hears of
    begins, so a resumed run starts at its checkpoint's step, and the time left is estimated
    from the steps of this run alone."""

    def __init__(self, steps: int, stream: TextIO, clock: Callable[[], float] = time.monotonic):
        self.steps = steps
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.first: int | None = None
        """The steps done before this run (a resumed run's checkpoint)."""
        self.drawn = False

    def __call__(self, metrics: dict) -> None:
        """Shows the step ``metrics`` describes (a metrics line, 1-based ``step``)."""
        step = int(metrics["step"])
        if self.first is None:
            self.first = step - 1
        self.stream.write("\r" + self.line(step, metrics) + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    label = "training"
    """What the bar counts, at the start of its line."""

    def line(self, step: int, metrics: dict) -> str:
        """The bar after ``step`` steps of ``self.steps``."""
        done = min(step / self.steps, 1.0) if self.steps else 1.0
        filled = round(done * WIDTH)
        bar = "#" * filled + "-" * (WIDTH - filled)
        ran = step - (self.first or 0)
        left = (self.clock() - self.started) / ran * (self.steps - step) if ran else 0.0
        status = self.status(metrics)
        shown = f"  {status}" if status else ""
        return f"{self.label} [{bar}] {step}/{self.steps} {done:4.0%}{shown}  ETA {duration(left)}"

    def status(self, metrics: dict) -> str:
        """What the line says of the step beside the bar: its loss, and the held-out one."""
        loss = f"loss {metrics['loss']:.6f}"
        if "eval_loss" in metrics:
            loss += f", eval loss {metrics['eval_loss']:.6f}"
        return loss

    def close(self) -> None:
        """Ends the bar's line."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
