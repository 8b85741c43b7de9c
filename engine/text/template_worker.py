"""The chat-template worker's handler: renders Jinja2 chat templates in a separate Python process.

A chat template comes from a model file and is hostile input: it can loop for hours, recurse without
end, or build strings of gigabytes, and a Python thread that runs it cannot be stopped. So templates
render in a worker process the parent can kill (:mod:`infer.engine.workers`, driven by
:mod:`infer.engine.text.sandbox`), under its memory bound (``RLIMIT_AS``; an allocation past it is a
``MemoryError``, reported as one line) and wall-clock bound, plus two of this module's own:

* an output bound: rendering streams and stops once the text passes ``max_chars``;
* a recursion bound: Python's frame limit (``RecursionError``, reported as one line).

Jinja2's immutable sandbox still applies inside (no attribute walking, no mutation of the context,
``range`` capped), with the environment of transformers' ``apply_chat_template``
(``transformers.utils.chat_template_utils._cached_compile_jinja_template``, 5.24): trim_blocks and
lstrip_blocks, loop controls, the ``{% generation %}`` tag (it renders its body), a ``tojson`` that
neither escapes HTML nor non-ASCII text, ``raise_exception``, ``strftime_now``, a ``dict`` with
``fromkeys`` and a ``namespace`` that refuses underscore-prefixed names. Every template in
tests/data/templates renders byte for byte as transformers renders it
(tests/test_chat_templates_transformers.py).

This file imports only the standard library and Jinja2: the worker loads it by path without
importing ``infer``. A job is ``{"template", "context", "max_chars"}`` plus an optional ``"now"`` (an
ISO date-time ``strftime_now`` reads instead of the clock); the reply ``{"text"}`` or ``{"error"}``.
"""

from __future__ import annotations

import json
import sys
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar, NoReturn

import jinja2
import jinja2.nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

RECURSION_LIMIT = 1000
"""Python frames (about a hundred nested macro calls)."""


class TemplateRejected(Exception):
    """The template called ``raise_exception``: it cannot express these messages."""


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject conversations they cannot express (e.g. roles out of order).
    raise TemplateRejected(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # Same signature and defaults as transformers' filter; Jinja's own tojson escapes HTML characters.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


_NOW: ContextVar[datetime | None] = ContextVar("now", default=None)
"""The fixed clock of the job being rendered (None: the real clock)."""


def _strftime_now(format: str) -> str:
    return (_NOW.get() or datetime.now()).strftime(format)


class GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers' tag around the assistant's text (it
    tracks those spans for assistant-token masks). Rendering emits the body, through a call block as
    transformers does, so the body's ``set`` stays inside it there and here alike."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Parser) -> jinja2.nodes.Node:
        """The tag's body as a call block that renders it."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


class TemplateDict:
    """The ``dict`` global: a call builds a dict, ``dict.fromkeys`` works, and nothing else is reachable
    (transformers' own class; Jinja's default ``dict`` global has no ``fromkeys``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        """``dict.fromkeys``."""
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(Namespace):
    """``namespace(...)`` that refuses underscore-prefixed attribute names, as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # No named `self`, like Jinja's Namespace, so that namespace(self=...) still works.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}"
            )


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    """The sandboxed environment templates render in (transformers' settings)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (compiling is the slow part; a server renders the same few templates)."""
    return environment().from_string(source)


class OutputTooLarge(Exception):
    """The rendered text passed the output limit."""


def render(source: str, context: dict[str, Any], max_chars: int, now: datetime | None = None) -> str:
    """Render ``source`` with ``context``, streaming, and stop once the text passes ``max_chars``;
    ``strftime_now`` reads ``now`` when given."""
    pieces: list[str] = []
    size = 0
    token = _NOW.set(now)
    try:
        for piece in compile_template(source).generate(**context):
            size += len(piece)
            if size > max_chars:
                raise OutputTooLarge(f"chat template output exceeds {max_chars} characters")
            pieces.append(piece)
    finally:
        _NOW.reset(token)
    return "".join(pieces)


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(exc: BaseException, memory_mb: int) -> str:
    """The one-line message for a failed render."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"chat template does not parse (line {exc.lineno}): {_one_line(exc.message or '')}"
    if isinstance(exc, TemplateRejected):
        return f"chat template rejected the messages: {_one_line(str(exc))}"
    if isinstance(exc, OutputTooLarge):
        return str(exc)
    if isinstance(exc, MemoryError):
        return f"chat template needed more than {memory_mb} MiB of memory to render"
    if isinstance(exc, RecursionError):
        return f"chat template recursed too deeply (more than {RECURSION_LIMIT} Python frames)"
    if isinstance(exc, jinja2.TemplateError):  # undefined variables, sandbox violations
        return f"chat template failed to render: {_one_line(str(exc))}"
    return f"chat template failed to render: {type(exc).__name__}: {_one_line(str(exc))}"


def prepare() -> None:
    """Build the environment and compile once before the memory cap applies (the worker calls this)."""
    sys.setrecursionlimit(RECURSION_LIMIT)
    environment()
    compile_template("{{ '' }}")


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """One render job: ``{"template", "context", "max_chars"}`` (and optionally ``"now"``) in,
    ``{"text"}`` out."""
    now = datetime.fromisoformat(request["now"]) if request.get("now") else None
    return {"text": render(request["template"], request["context"], int(request["max_chars"]), now)}
