"""What every route needs: the engine, its async bridge, the resolved settings, and prompt tokenization
that never blocks the event loop."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from infer.cli.serve.bridge import EngineBridge
from infer.cli.serve.errors import APIError
from infer.cli.serve.reasoning import thinking_for_prompt
from infer.cli.serve.schemas import INVALID_GRAMMAR, Generation, is_constraint_param
from infer.cli.serve.tools import ToolChoice, ToolPlan, plan_tools, tools_free
from infer.engine import (
    GENERIC_TOOL_SYNTAX,
    CallSyntax,
    ChatTemplateError,
    Engine,
    Request,
    RequestError,
    RequestStream,
    TemplateSandbox,
    ThinkingStart,
    chat_template_of,
    prompt_ids,
    splits_reasoning,
    syntax_for_template,
    syntax_named,
    template_renders_tools,
)
from infer.profiles.settings import Settings


def new_id(prefix: str) -> str:
    """An OpenAI-looking object id: `new_id("chatcmpl-")` -> `chatcmpl-3f2a...`."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _message_text(messages: list[dict[str, Any]]) -> str:
    """The text content of `messages` (the rendered prompt is this plus template text)."""
    pieces: list[str] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "".join(pieces)


def _check_encodable(value: Any, param: str) -> None:
    """APIError 400 for text the tokenizer cannot take: JSON allows lone surrogates (`"\\ud800"`),
    which are not Unicode scalar values and have no UTF-8 form."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise APIError(
                f"the {param} contains an invalid Unicode code point ({exc.reason}, "
                f"{value[exc.start]!r} at offset {exc.start})",
                param=param,
            ) from None
    elif isinstance(value, dict):
        for item in value.values():
            _check_encodable(item, param)
    elif isinstance(value, list):
        for item in value:
            _check_encodable(item, param)


@dataclass
class ServeContext:
    """The server's shared state, created once per app."""

    engine: Engine
    settings: Settings
    model_id: str
    aliases: tuple[str, ...] = ()
    """Other names requests may use for the model (`infer serve --alias`)."""
    accept_any_model: bool = False
    """Every model name a request gives is answered by the served model (`--accept-any-model`)."""
    bridge: EngineBridge = field(init=False)
    sandbox: TemplateSandbox = field(default_factory=TemplateSandbox)
    """The chat-template worker: started with the app, killed when a render runs past its time."""
    compiles: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-compile")
    )
    """Where a body's grammar compiles (waiting on the one compile worker): apart from the event
    loop's default threads, so requests that wait for hostile grammars never delay the ones without."""
    tool_call_parser: str | None = None
    """`--tool-call-parser`: the call syntax replies are read in (None: the one the template teaches)."""
    reasoning_parser: str = "auto"
    """`--reasoning-parser`: auto (split `<think>` blocks when the template writes them), think, none."""
    created: int = field(default_factory=lambda: int(time.time()))
    """When the model was loaded (the /v1/models `created` field)."""

    def __post_init__(self) -> None:
        self.bridge = EngineBridge(self.engine)
        tokenizer = self.engine.tokenizer
        # The longest token's byte length bounds how much text one token can cover, so text longer
        # than ctx_size * that (twice, for normalizer slack) cannot fit and is refused without
        # spending seconds tokenizing megabytes.
        self._longest_token = max(
            (len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)), default=1
        )

    @property
    def served_names(self) -> tuple[str, ...]:
        """The model's name and its aliases: what a request's `model` may say."""
        return (self.model_id, *self.aliases)

    def check_model(self, name: str | None) -> None:
        """APIError 404 `model_not_found` when a request names a model this server does not serve (no
        name at all is accepted: the server has one model; with `accept_any_model`, any name is)."""
        if name is not None and not self.accept_any_model and name not in self.served_names:
            raise APIError(
                f"The model {name!r} does not exist: this server serves {', '.join(self.served_names)}",
                status=404,
                param="model",
                code="model_not_found",
            )

    @property
    def ctx_size(self) -> int:
        """Positions per sequence (prompt plus generated tokens)."""
        return self.engine.config.ctx_size

    @property
    def vocab_size(self) -> int:
        """Token ids the model knows."""
        return self.engine.tokenizer.vocab_size

    def _check_size(self, text: str, param: str) -> None:
        size = len(text.encode("utf-8"))
        if size > 2 * self.ctx_size * max(self._longest_token, 1):
            raise APIError(
                f"This model's maximum context length is {self.ctx_size} tokens, but the {param} is "
                f"{size} bytes of text, far more than fits.",
                param=param,
                code="context_length_exceeded",
            )

    async def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        param: str = "messages",
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of `messages` rendered with the model's chat template, `tools` handed to it
        (APIError 400 if bad)."""
        tokenizer = self.engine.tokenizer

        def work() -> list[int]:
            _check_encodable(messages, param)
            _check_encodable(tools, "tools")
            self._check_size(_message_text(messages), param)
            if tools:
                self._check_size(json.dumps(tools), "tools")
            try:
                return prompt_ids(tokenizer, messages=messages, sandbox=self.sandbox, tools=tools)
            except ChatTemplateError as exc:
                raise APIError(str(exc), param=param, code=exc.code) from None

        return await asyncio.to_thread(work)

    async def tool_prompt(
        self, messages: list[dict[str, Any]], choice: ToolChoice | None, param: str = "messages"
    ) -> tuple[list[int], ToolPlan | None]:
        """`chat_prompt` for a request with tools: its plan (cli/serve/tools.py), and the prompt
        rendered as the plan says (the template's own tool rendering or the generic tool prompt)."""
        if choice is None:
            return await self.chat_prompt(tools_free(messages, param), param), None
        forms = [tool.template_form() for tool in choice.tools]
        # Checked before the tools join the messages (the generic prompt), off the event loop.
        await asyncio.to_thread(lambda: self._check_size(json.dumps(forms), "tools"))
        renders, syntax = await asyncio.to_thread(lambda: self._template_tools)
        plan = plan_tools(choice, parser=self.tool_call_parser, template_syntax=syntax, renders_tools=renders)
        assert plan is not None
        ids = await self.chat_prompt(plan.messages(messages, param), param, plan.template_tools())
        return ids, plan

    @functools.cached_property
    def _template_tools(self) -> tuple[bool, CallSyntax]:
        """Whether the model's template renders tools, and the call syntax it teaches (once)."""
        tokenizer = self.engine.tokenizer
        try:
            template = chat_template_of(tokenizer)
        except ChatTemplateError:
            return False, syntax_named(GENERIC_TOOL_SYNTAX)
        return template_renders_tools(tokenizer, self.sandbox), syntax_for_template(template)

    def thinking_of(self, prompt: Sequence[int]) -> ThinkingStart | None:
        """How a reply to the chat `prompt` starts (outside or inside a thinking block), or None
        when replies are not split into reasoning and content (cli/serve/reasoning.py)."""
        return thinking_for_prompt(self._splits_reasoning, self.engine.tokenizer, prompt)

    @functools.cached_property
    def _splits_reasoning(self) -> bool:
        """Whether replies are split, from `reasoning_parser` and the model's template (once)."""
        try:
            template: str | None = chat_template_of(self.engine.tokenizer)
        except ChatTemplateError:
            template = None
        return splits_reasoning(self.reasoning_parser, template)

    async def text_prompt(self, prompt: str | Sequence[int], param: str = "prompt") -> list[int]:
        """Token ids of a raw prompt (text, or ids checked against the vocabulary)."""
        if not isinstance(prompt, str):
            bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise APIError(
                    f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})", param=param
                )
            return list(prompt)
        _check_encodable(prompt, param)
        self._check_size(prompt, param)
        return await asyncio.to_thread(prompt_ids, self.engine.tokenizer, prompt=prompt)

    def submit(self, requests: Sequence[Request], prompt_param: str) -> list[RequestStream]:
        """Submit to the engine; a request it refuses is APIError 400 (503 while shutting down)."""
        try:
            return self.bridge.submit(requests)
        except RequestError as exc:
            param = prompt_param if exc.parameter == "prompt" else exc.parameter
            code = INVALID_GRAMMAR if is_constraint_param(param) else None
            raise APIError(str(exc), param=param, code=code) from None

    async def start(
        self,
        body: Generation,
        prompts: Sequence[Sequence[int]],
        *,
        choices: int,
        id_prefix: str,
        prompt_param: str,
    ) -> tuple[list[Request], int, list[RequestStream]]:
        """Build `body`'s engine requests for `prompts` (its `to_requests`) and submit them, off the
        event loop: the work that grows with a request (compiling its grammar, building its matcher
        and sampler chain, a large `logit_bias`) never holds up another request's events or
        `/health`. Returns (requests, seed, streams); a client that leaves meanwhile has them
        cancelled."""

        loop = asyncio.get_running_loop()
        if body.has_constraint():
            await loop.run_in_executor(self.compiles, body.grammar_spec)  # kept by the body

        def work() -> tuple[list[Request], int, list[RequestStream]]:
            requests, seed = body.to_requests(
                prompts,
                self.settings,
                ctx_size=self.ctx_size,
                vocab_size=self.vocab_size,
                choices=choices,
                id_prefix=id_prefix,
                prompt_param=prompt_param,
            )
            return requests, seed, self.submit(requests, prompt_param)

        future = loop.run_in_executor(None, work)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._release_orphans)
            raise

    def _release_orphans(
        self, future: asyncio.Future[tuple[list[Request], int, list[RequestStream]]]
    ) -> None:
        """Cancel the streams a submission made for a client that had already left."""
        if not future.cancelled() and future.exception() is None:
            self.bridge.release(future.result()[2])
