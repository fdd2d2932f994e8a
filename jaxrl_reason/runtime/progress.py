"""A minimal console progress bar (no dependency): one line per phase, redrawn in place.

On a terminal the line is redrawn with a carriage return; when stdout is not a terminal
(CI logs, files) a line is printed every `print_every` steps instead. In a multi-host job
only process 0 draws (every process counts).
"""

from __future__ import annotations

import sys
import time


def _primary_process() -> bool:
    """Whether this is process 0 of a JAX job (True when JAX is not in use)."""
    if "jax" not in sys.modules:
        return True
    import jax
    return jax.process_index() == 0


class ProgressBar:
    """`ProgressBar(total, desc)`; `update(n=1, postfix="")`; `close()`."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True, width: int = 24,
                 print_every: int = 10, stream=None):
        enabled = enabled and _primary_process()
        self.total, self.desc, self.enabled, self.width = max(int(total), 1), desc, enabled, width
        self.print_every = max(print_every, 1)
        self.stream = sys.stdout if stream is None else stream
        self.count, self.start = 0, time.time()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def _line(self, postfix: str) -> str:
        frac = min(self.count / self.total, 1.0)
        filled = int(round(frac * self.width))
        elapsed = time.time() - self.start
        eta = elapsed / self.count * (self.total - self.count) if self.count else 0.0
        bar = "#" * filled + "-" * (self.width - filled)
        text = (f"{self.desc} [{bar}] {self.count}/{self.total} "
                f"{elapsed:6.1f}s<{eta:6.1f}s")
        return text + (f" | {postfix}" if postfix else "")

    def update(self, n: int = 1, postfix: str = "") -> None:
        self.count += n
        if not self.enabled or n == 0:
            return
        if self.tty:
            self.stream.write("\r" + self._line(postfix)[:200].ljust(120))
            self.stream.flush()
        elif self.count % self.print_every == 0 or self.count >= self.total:
            self.stream.write(self._line(postfix) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
