"""The request body of POST /v1/responses (OpenAI's Responses API), and its messages for the chat
template; the fields every generation route shares are `schemas.Generation`'s."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from infer.cli.serve.errors import APIError
from infer.cli.serve.request_caps import MAX_CONTENT_PARTS, MAX_INCLUDE, MAX_MESSAGES, MAX_METADATA, MAX_TOOLS
from infer.cli.serve.schemas import BodyModel, ContentPart, Generation, ResponseFormat
from infer.cli.serve.tools import ToolChoice, read_tool_choice
from infer.engine import GrammarSpec


class InputPart(ContentPart):
    """A content part of a Responses input message (`input_text`, or `output_text` of a past turn)."""


class InputItem(BaseModel):
    """A Responses input item: a message, a past `function_call` of the model, or the
    `function_call_output` the caller sends back for it."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr = "message"
    role: Optional[Literal["user", "assistant", "system", "developer"]] = None
    content: Union[StrictStr, Annotated[list[InputPart], Field(max_length=MAX_CONTENT_PARTS)], None] = None
    call_id: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    arguments: Optional[StrictStr] = None
    output: Optional[Union[StrictStr, Annotated[list[InputPart], Field(max_length=MAX_CONTENT_PARTS)]]] = None


class TextConfig(BodyModel):
    """`text`: the output format (`{"type": "text"}`, `json_object` or `json_schema`)."""

    format: Optional[ResponseFormat] = None


class ResponsesRequest(Generation):
    """POST /v1/responses."""

    input: Union[StrictStr, Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]] = Field(
        description="A user message, or a list of messages."
    )
    instructions: Optional[StrictStr] = Field(None, description="A system message placed first.")
    max_output_tokens: Optional[StrictInt] = Field(
        None, description="Most tokens to generate; omitted = up to the end of the context."
    )
    top_logprobs: Optional[StrictInt] = Field(None, ge=0, le=20, description="Alternatives per token.")
    include: Optional[list[StrictStr]] = Field(None, max_length=MAX_INCLUDE)
    text: Optional[TextConfig] = None
    tools: Optional[list[dict[str, Any]]] = Field(
        None, max_length=MAX_TOOLS, description="Function tools the model may call (JSON-schema parameters)."
    )
    tool_choice: Optional[Union[StrictStr, dict[str, Any]]] = Field(
        None, description="none, auto (the default with tools), required, or {type: function, name}."
    )
    parallel_tool_calls: Optional[StrictBool] = Field(
        None, description="Whether one response may hold several calls (default true)."
    )
    previous_response_id: Optional[StrictStr] = None
    store: Optional[StrictBool] = None
    metadata: Optional[dict[str, StrictStr]] = Field(None, max_length=MAX_METADATA)

    def token_limit(self) -> tuple[int | None, str]:
        """`max_output_tokens`."""
        return self.max_output_tokens, "max_output_tokens"

    def wants_logprobs(self) -> bool:
        """Whether output_text carries logprobs."""
        return bool(self.top_logprobs) or "message.output_text.logprobs" in (self.include or [])

    def logprob_count(self) -> int | None:
        """`top_logprobs` alternatives when logprobs are wanted."""
        return (self.top_logprobs or 0) if self.wants_logprobs() else None

    def check_supported(self) -> None:
        """Refuse what this server cannot honour."""
        super().check_supported()
        for name in ("return_token_ids", "return_tokens_as_token_ids"):
            if getattr(self, name):
                raise APIError(f"{name} is not supported on /v1/responses", param=name)
        if self.previous_response_id is not None:
            raise APIError(
                "previous_response_id is not supported: responses are not stored",
                param="previous_response_id",
            )

    def tool_choice_of(self) -> ToolChoice | None:
        """The body's tools and choice, checked (APIError 400 naming the field)."""
        return read_tool_choice(self.tools, self.tool_choice, self.parallel_tool_calls, flat=True)

    def format_spec(self) -> GrammarSpec | None:
        """`text.format`."""
        fmt = self.text.format if self.text is not None else None
        return None if fmt is None else fmt.grammar_spec("text.format")

    def asks_free_text(self) -> bool:
        """`text.format` type text."""
        return self.text is not None and self.text.format is not None and self.text.format.type == "text"

    def format_spec_given(self) -> bool:
        """`text.format` other than text."""
        fmt = self.text.format if self.text is not None else None
        return fmt is not None and fmt.type != "text"

    def chat_messages(self) -> list[dict[str, Any]]:
        """`instructions` and `input` as chat messages: `function_call` items become the
        `tool_calls` of an assistant turn (consecutive calls one turn), `function_call_output`
        items `tool` turns, a `reasoning` item the `reasoning_content` of the assistant turn it
        starts (templates that keep past reasoning write it). Raises APIError for another item
        type."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
            return messages
        if not self.input:
            raise APIError("input must not be empty", param="input")
        for i, item in enumerate(self.input):
            if item.type == "function_call":
                messages.append(_call_turn(item, i, messages))
                continue
            if item.type == "reasoning":
                reasoning = _reasoning_text(item, i)
                if reasoning:  # an item with only encrypted content has nothing to hand over
                    messages.append({"role": "assistant", "content": "", "reasoning_content": reasoning})
                continue
            if item.type == "function_call_output":
                if item.call_id is None or item.output is None:
                    raise APIError(
                        f"input item {i} (function_call_output) needs call_id and output", param=f"input.{i}"
                    )
                output = _joined(item.output, i) if isinstance(item.output, list) else item.output
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
                continue
            if item.type != "message" or item.role is None:
                raise APIError(
                    f"input item {i} of type {item.type!r} is not supported "
                    "(messages, function_call and function_call_output)",
                    param=f"input.{i}",
                )
            content = _joined(item.content, i) if isinstance(item.content, list) else item.content
            if item.role == "assistant" and _only_reasoning(messages):
                messages[-1] = {**messages[-1], "content": content or ""}
                continue
            messages.append({"role": item.role, "content": content or ""})
        return messages


def _reasoning_text(item: InputItem, i: int) -> str:
    """A `reasoning` item's text: its `reasoning_text` parts, or else its `summary_text` parts."""
    parts = item.content if isinstance(item.content, list) else []
    texts = [p.text for p in parts if p.type == "reasoning_text" and p.text is not None]
    if not texts:
        summary = (item.model_extra or {}).get("summary")
        if summary is not None and not isinstance(summary, list):
            raise APIError(f"input item {i} (reasoning): summary must be a list", param=f"input.{i}.summary")
        texts = [
            p["text"]
            for p in summary or []
            if isinstance(p, dict) and p.get("type") == "summary_text" and isinstance(p.get("text"), str)
        ]
    return "\n".join(texts)


def _only_reasoning(messages: list[dict[str, Any]]) -> bool:
    """Whether the last turn is an assistant turn holding only reasoning (a `reasoning` item), which
    the assistant message after it completes."""
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and "reasoning_content" in last and not last.get("content")


def _joined(parts: list[InputPart], i: int) -> str:
    texts = []
    for j, part in enumerate(parts):
        if part.type not in ("input_text", "output_text", "text") or part.text is None:
            raise APIError(
                f"input item {i} part {j} of type {part.type!r} is not supported (only text)",
                param=f"input.{i}.content.{j}",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _call_turn(item: InputItem, i: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant turn a `function_call` item belongs to: the previous one when it holds calls
    already (taken off `messages`: the caller appends the turn again), else a new one."""
    if item.call_id is None or item.name is None:
        raise APIError(f"input item {i} (function_call) needs call_id and name", param=f"input.{i}")
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments or "{}"},
    }
    if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
        turn = messages.pop()
        return {**turn, "tool_calls": [*turn["tool_calls"], call]}
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        turn = messages.pop()  # the text the model wrote before its calls
        return {**turn, "tool_calls": [call]}
    return {"role": "assistant", "content": None, "tool_calls": [call]}
