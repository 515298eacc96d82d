"""How ``cgc train`` shows its steps: a one-line bar on a terminal (step/steps, loss, time
left), a line per step otherwise (a log keeps every loss); and how ``cgc compile`` and
``cgc run`` show theirs on a terminal (``StepsBar``: a compile's passes, a run's layers)."""

from __future__ import annotations

import contextlib
import shutil
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
        status = self.status(metrics)
        shown = f"  {status}" if status else ""
        return f"{self.counted(step)}{shown}  {self.timing(step)}"

    def counted(self, step: int) -> str:
        """The label, the bar and the count after ``step`` steps."""
        done = min(step / self.steps, 1.0) if self.steps else 1.0
        filled = round(done * WIDTH)
        bar = "#" * filled + "-" * (WIDTH - filled)
        return f"{self.label} [{bar}] {step}/{self.steps} {done:4.0%}"

    def timing(self, step: int) -> str:
        """The time left after ``step`` steps, from the steps of this run."""
        ran = step - (self.first or 0)
        left = (self.clock() - self.started) / ran * (self.steps - step) if ran else 0.0
        return f"ETA {duration(left)}"

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


class StepsBar(ProgressBar):
    """A bar of named steps told as they begin (``step``): a compile's passes, each
    compilation of the memory plan counted anew, or a run's layers. A total of 0 is not known
    yet (a compile's import: its passes are chosen after it); a bar that ``estimates`` shows
    the time left, else the time taken (a compile's passes differ too much in cost to tell).
    The line is cut to the terminal's width (a wrapped line would not be redrawn in place);
    at the end the bar clears it: what the command prints after it is all that stays, as it
    would be without a terminal."""

    def __init__(
        self,
        label: str,
        stream: TextIO,
        estimates: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(0, stream, clock)
        self.label = label
        self.estimates = estimates

    def step(self, number: int, total: int, name: str) -> None:
        """Shows step ``number`` of ``total``, named ``name``, beginning."""
        self.steps = total
        self({"step": number, "name": name})

    def line(self, step: int, metrics: dict) -> str:
        """The bar, the time and the step's name last (cut first if the line is too long)."""
        name = metrics["name"]
        if self.steps:
            text = f"{self.counted(step)}  {self.timing(step)}  {name}"
        else:
            text = f"{self.label} {name}"
        return text[: shutil.get_terminal_size().columns - 1]

    def timing(self, step: int) -> str:
        if self.estimates:
            return super().timing(step)
        return duration(self.clock() - self.started)

    def close(self) -> None:
        """Clears the bar's line."""
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def step_reporter(
    stack: contextlib.ExitStack,
    steps: int,
    terminal: TextIO | None,
    echo: Callable[[str], None],
) -> Callable[[dict], None]:
    """A progress bar on ``terminal`` (closed with ``stack``), or without one a line per
    step to ``echo``."""
    if terminal is not None:
        bar = ProgressBar(steps, terminal)
        stack.callback(bar.close)
        return bar
    return lambda metrics: echo(step_line(metrics))


def steps_bar(
    stack: contextlib.ExitStack, label: str, terminal: TextIO | None, estimates: bool = True
) -> Callable[[int, int, str], None] | None:
    """On ``terminal``, a bar of the steps of a compile or a run (``StepsBar``), cleared when
    ``stack`` closes; nothing without one (the command's output is the same either way)."""
    if terminal is None:
        return None
    bar = StepsBar(label, terminal, estimates)
    stack.callback(bar.close)
    return bar.step
