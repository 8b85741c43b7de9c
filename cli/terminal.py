"""What a person at a terminal sees while a command works: a status line, text as it arrives, Ctrl-C.

`StatusLine` is one transient line on stderr (a spinner, what is happening, seconds so far) shown only
when stderr is a terminal, so nothing waits on a blank screen and pipes stay clean. `run_request`
drives one request on an engine whose step loop runs in a background thread (`Engine.start`), so
Ctrl-C reaches the main thread while it waits: the request is cancelled and `Interrupted` carries
what was generated so far.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text

from infer.engine import DoneEvent, Engine, Request, TokenEvent

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C, as a shell reports SIGINT (128 + 2)."""


class _Seconds(ProgressColumn):
    """Elapsed time as `2.1 s`."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.elapsed or 0.0:.1f} s", style="dim")


class StatusLine:
    """One transient status line on stderr (`⠋ loading SmolLM2-135M-Instruct… 2.1 s`), only on a terminal.

    `show(text)` starts it or changes its text (the seconds restart); `clear()` removes it. Use it as a
    context manager so it is cleared on every exit path.
    """

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._progress: Progress | None = None

    @property
    def enabled(self) -> bool:
        """Whether anything is drawn (stderr is a terminal)."""
        return self._console.is_terminal

    def show(self, text: str) -> None:
        """Show `text` with a spinner and the seconds since this call."""
        if not self.enabled:
            return
        self.clear()
        # redirect_stdout off: stdout carries the generated text, which must never pass through Rich.
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            _Seconds(),
            console=self._console,
            transient=True,
            redirect_stdout=False,
        )
        self._progress.start()
        self._progress.add_task(text, total=None)

    def clear(self) -> None:
        """Remove the line (no-op when none is shown)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.clear()


class Interrupted(Exception):
    """Ctrl-C stopped a generation; carries its (cancelled) DoneEvent, whose text is what was made."""

    def __init__(self, done: DoneEvent) -> None:
        super().__init__("interrupted")
        self.done = done


def write_stdout(text: str) -> None:
    """Write `text` to stdout at once (a terminal sees each token as it is sampled)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def run_request(
    engine: Engine,
    request: Request,
    on_text: Callable[[str], None] | None = None,
    status: StatusLine | None = None,
) -> DoneEvent:
    """Submit `request` to a started engine, pass each text delta to `on_text`, return its DoneEvent.

    `status` (if given) reads "reading the prompt…" until the first token, then is cleared. On Ctrl-C
    the request is cancelled and `Interrupted` is raised with its DoneEvent (the text so far).
    """
    handle = engine.submit(request)
    if status is not None:
        known = len(request.prompt_ids)  # none for a server's request: it tokenizes the prompt itself
        status.show(f"reading the prompt ({known} tokens)…" if known else "waiting for the first token…")
    try:
        for event in handle:
            if isinstance(event, TokenEvent):
                if status is not None:
                    status.clear()
                if event.text and on_text is not None:
                    on_text(event.text)
            else:
                return event
    except KeyboardInterrupt:
        handle.cancel()
        for event in handle:  # the rest of the queue, ending with DoneEvent(cancelled)
            if isinstance(event, DoneEvent):
                raise Interrupted(event) from None
    finally:
        if status is not None:
            status.clear()
    raise RuntimeError("the request's stream ended without a DoneEvent")
