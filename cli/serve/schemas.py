"""Request bodies of the OpenAI-compatible routes, and their conversion to engine requests.

Types are strict (`"0.5"` is not a number, `1.5` is not an integer) and unknown fields are ignored,
as OpenAI ignores them. Value ranges are not written here: `to_sampling_params()` builds the engine's
`SamplingParams`, whose own validation rejects a bad value with the field's name, and `Request` checks
its limits. The sampler fields (OpenAI's `temperature`, `top_p`, ... and llama.cpp's `top_k`, `min_p`,
`samplers`, ...) are generated from the profile schema, so every sampler setting is an API field under
its one name, with its description in `/openapi.json`.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    create_model,
)

from infer.cli.serve.errors import APIError
from infer.cli.serve.request_caps import (
    LIST_CAPS,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_PROMPT_TOKEN_IDS,
    MAX_PROMPTS,
    MAX_TOOLS,
    STRING_CAPS,
)
from infer.cli.serve.tools import ToolChoice, read_tool_choice
from infer.engine import (
    VALID_ROLES,
    GrammarError,
    GrammarSpec,
    Request,
    RequestError,
    SamplingParams,
    SamplingParamsError,
    SpecConfig,
    SpecConfigError,
)
from infer.profiles.requests import FROM_SETTINGS, build_request, spec_config
from infer.profiles.schema import SamplerSection, SpeculativeSection
from infer.profiles.settings import SETTINGS, Settings, unused_spec_keys

StrictFloat = Annotated[float, Strict()]
"""A JSON number (an integer is a number too); a string is a type error."""

_SEED_SPACE = 1 << 64

INVALID_GRAMMAR = "invalid_grammar"
"""The error code of a refused output constraint (a bad, too large or too deep schema or grammar)."""

_CONSTRAINT_FIELDS = frozenset(
    {"json_schema", "grammar", "response_format", "text", "regex", "choice", "json_object"}
)


def is_constraint_param(param: str | None) -> bool:
    """Whether an error's `param` names an output constraint (`response_format.json_schema.schema`)."""
    return param is not None and param.split(".")[0] in _CONSTRAINT_FIELDS


class BodyModel(BaseModel):
    """The base of every body model: OpenAI ignores fields it does not know; so do we (a client may
    send newer fields)."""

    model_config = ConfigDict(extra="ignore")


def _strict(annotation: Any, name: str = "") -> Any:
    """The profile schema's type with every scalar made strict (no "1.5" -> 1.5 coercion), and the
    list of a capped field (`LIST_CAPS`, `STRING_CAPS`) bounded."""
    scalars = {float: StrictFloat, int: StrictInt, str: StrictStr, bool: StrictBool}
    if annotation in scalars:
        return scalars[annotation]
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return Union[tuple(_strict(a, name) for a in get_args(annotation))]
    if origin is list:
        return capped_list(_strict(get_args(annotation)[0]), name)
    return annotation


def capped_list(item: Any, name: str) -> Any:
    """`list[item]`, with at most `LIST_CAPS[name]` items of at most `STRING_CAPS[name]` characters."""
    if name in STRING_CAPS:
        item = Annotated[item, Field(max_length=STRING_CAPS[name])]
    if name in LIST_CAPS:
        return Annotated[list[item], Field(max_length=LIST_CAPS[name])]  # type: ignore[valid-type]
    return list[item]  # type: ignore[valid-type]


def _sampler_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {
        name: (Optional[_strict(info.annotation, name)], Field(None, description=info.description))
        for name, info in SamplerSection.model_fields.items()
    }
    fields["logit_bias"] = (
        Optional[dict[StrictStr, StrictFloat]],
        Field(
            None, description="{token id: bias} added to the logits; -100 or less practically bans a token."
        ),
    )
    return fields


SPECULATIVE_FIELD_NAMES: tuple[str, ...] = tuple(
    spec.name for spec in SETTINGS.values() if spec.section == "speculative"
)
"""The speculative settings under their one name (`spec_method`, ...): API fields too, on top of the
server's own (`Generation.to_spec_config`); `spec_draft_model` only names the model the server loaded."""


def _speculative_fields() -> dict[str, Any]:
    return {
        f"spec_{name}": (
            Optional[_strict(info.annotation)],
            Field(None, description=f"{info.description} Per request; omitted = the server's setting."),
        )
        for name, info in SpeculativeSection.model_fields.items()
    }


_SamplerFields: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "SamplerFields",
    __base__=BodyModel,
    __doc__="Sampler fields; omitted ones use the profile's defaults.",
    **_sampler_fields(),
    **_speculative_fields(),
)
SAMPLER_FIELD_NAMES: tuple[str, ...] = tuple(
    n for n in SamplingParams.field_names() if n in _SamplerFields.model_fields
)
"""Body fields that go straight to `SamplingParams` (under the same name)."""


def _bans_every_token(params: SamplingParams, vocab_size: int) -> bool:
    """Whether `logit_bias` is -inf for every token (knowable before any step runs)."""
    bias = params.logit_bias
    return len(bias) >= vocab_size and all(b == float("-inf") for b in bias.values())


class StreamOptions(BodyModel):
    """`stream_options`: ask for a last chunk carrying usage."""

    include_usage: StrictBool = False


class Generation(_SamplerFields):  # type: ignore[misc,valid-type]
    """Fields every generation route shares."""

    model: Optional[StrictStr] = Field(
        None, description="The served model's name or an --alias (another name: 404 model_not_found)."
    )
    stream: StrictBool = Field(False, description="Send Server-Sent Events as tokens are sampled.")
    stream_options: Optional[StreamOptions] = None
    stop: Optional[
        Union[Annotated[StrictStr, Field(max_length=STRING_CAPS["stop"])], capped_list(StrictStr, "stop")]
    ] = Field(None, description="Stop strings (the stop text is not returned).")
    ignore_eos: StrictBool = Field(
        False, description="llama.cpp extension: keep generating past end-of-text."
    )
    user: Optional[StrictStr] = None
    json_schema: Optional[dict[str, Any]] = Field(
        None, description="llama-server extension: constrain the output to this JSON schema."
    )
    grammar: Optional[StrictStr] = Field(
        None, description="llama-server extension: constrain the output to this GBNF (or Lark) grammar."
    )

    def format_spec(self) -> GrammarSpec | None:
        """The route's own output-format field (`response_format`, `text.format`) as a constraint."""
        return None

    def asks_free_text(self) -> bool:
        """The route's format field says `text`: free text even where the server was started with
        an output constraint (`--json-schema`, ...), as an explicit field outranks a server default."""
        return False

    def has_constraint(self) -> bool:
        """Whether the body asks for an output constraint of its own (one to compile)."""
        return (
            self.json_schema is not None
            or self.grammar is not None
            or self.format_spec_given()
            or self._tool_grammar is not None
        )

    _tool_grammar: Any = PrivateAttr(default=None)
    """`use_tool_grammar`'s maker of the tool-call constraint (called where the grammar compiles)."""

    _shown_special: tuple[int, ...] = PrivateAttr(default=())

    _tool_call_forced: bool = PrivateAttr(default=False)

    def use_tool_grammar(
        self,
        make: Callable[[bool], GrammarSpec | None],
        shown_special: tuple[int, ...] = (),
        *,
        forced: bool = False,
    ) -> None:
        """Generate under the constraint of the request's tools: `make(exclusive)` builds it (APIError
        400 for a refused schema); `exclusive` is False when the body asks for another constraint.
        `shown_special`: control tokens (call markers) the reply renders as text. `forced`: tool_choice
        is required or a named function, so the reply is a call and writes no text."""
        self._tool_grammar = make
        self._tool_call_forced = forced
        self.show_special(shown_special)

    def show_special(self, ids: tuple[int, ...]) -> None:
        """Render these control tokens as text in the reply (markers a reader must see)."""
        self._shown_special = tuple(sorted({*self._shown_special, *ids}))

    def format_spec_given(self) -> bool:
        """Whether the route's own format field asks for a constraint (not free text)."""
        return False

    _grammar: Any = PrivateAttr(default=None)
    """`grammar_spec()`'s result once made (compiling is the costly part of a request's checks)."""

    def grammar_spec(self) -> GrammarSpec | None:
        """The body's output constraint (None = the server's own setting, free text by default): the
        route's format field or llama-server's `json_schema` / `grammar`, at most one. An invalid or
        unsupported schema, or a bad grammar, is APIError 400 `invalid_grammar` naming the field.
        Compiled (in the compile worker) on the first call, then kept."""
        if self._grammar is None:
            self._grammar = (self._make_grammar_spec(),)
        return self._grammar[0]  # type: ignore[no-any-return]

    def _make_grammar_spec(self) -> GrammarSpec | None:
        given: list[GrammarSpec] = []
        try:
            if self.json_schema is not None:
                given.append(GrammarSpec.json_schema(self.json_schema, parameter="json_schema"))
            if self.grammar is not None:
                given.append(GrammarSpec.lark_or_gbnf(self.grammar, parameter="grammar"))
        except GrammarError as exc:
            raise APIError(str(exc), param=exc.parameter, code=INVALID_GRAMMAR) from None
        own = self.format_spec()
        if own is not None:
            given.append(own)
        if self._tool_grammar is not None:
            if self._tool_call_forced and own is not None:
                # A forced call is the whole reply, so the route's text format (response_format,
                # text.format) has no text to shape: OpenAI takes the two together, and so do clients
                # (instructor's RESPONSES_TOOLS sends both). json_schema or grammar beside it still clash.
                given.remove(own)
            tools = self._tool_grammar(not given)
            if tools is not None:
                given.append(tools)
        if len(given) > 1:
            names = ", ".join(str(spec.parameter) for spec in given)
            raise APIError(f"only one output constraint can be given, got {names}", param=given[1].parameter)
        return given[0] if given else None

    return_token_ids: StrictBool = Field(
        False, description="vLLM extension: each choice also carries its generated `token_ids`."
    )
    return_tokens_as_token_ids: StrictBool = Field(
        False, description='vLLM extension: logprob tokens are written "token_id:N" instead of text.'
    )

    def check_supported(self) -> None:
        """Refuse what this server cannot honour, rather than silently ignore it: a request cannot
        load another draft model (`spec_draft_model` is the server's `--model-draft`). (An output
        constraint that cannot be compiled is refused by `to_requests`, before any token.)"""
        draft = getattr(self, "spec_draft_model", None)
        if draft is not None:
            raise APIError(
                f"spec_draft_model = {draft!r}: the draft model is chosen when the server starts "
                "(--model-draft); a request can only turn it on with spec_method draft_model",
                param="spec_draft_model",
            )

    def to_spec_config(self, settings: Settings) -> SpecConfig | None:
        """The server's speculative settings with this body's `spec_*` fields on top (None = off).
        A field the chosen method would ignore, or an out-of-range value, is APIError 400."""
        given = {
            name.removeprefix("spec_"): getattr(self, name)
            for name in SPECULATIVE_FIELD_NAMES
            if getattr(self, name) is not None
        }
        method = given.get("method", settings.spec_method)
        unused = unused_spec_keys(method, given)
        if unused:
            raise APIError(
                f"spec_{unused[0]} is not used by spec_method {method}; remove it or choose a method "
                "that uses it",
                param=f"spec_{unused[0]}",
            )
        try:
            return spec_config(settings, given)
        except SpecConfigError as exc:
            raise APIError(str(exc), param=exc.parameter) from None

    # -- conversion ----------------------------------------------------------------------------
    def sampler_overrides(self) -> dict[str, Any]:
        """The sampler fields this body sets (the rest come from the profile)."""
        return self.model_dump(include=set(SAMPLER_FIELD_NAMES), exclude_none=True)

    def logprob_count(self) -> int | None:
        """How many alternatives per token the route's logprob fields ask for (None = not asked)."""
        return None

    def to_sampling_params(self, settings: Settings, vocab_size: int | None = None) -> SamplingParams:
        """The profile's sampler defaults with this body's fields on top, validated by the sampler.

        Raises APIError 400 naming the bad field.
        """
        overrides = self.sampler_overrides()
        count = self.logprob_count()
        if count is not None:
            overrides["n_probs"] = count
            overrides["logprobs"] = True
        try:
            params = settings.sampling_params(**overrides)
            if vocab_size is not None:
                params.check_vocab(vocab_size)
        except SamplingParamsError as exc:
            raise APIError(str(exc), param=exc.parameter) from None
        if vocab_size is not None and _bans_every_token(params, vocab_size):
            raise APIError(
                "logit_bias bans every token of the vocabulary (-inf for all): nothing can be sampled",
                param="logit_bias",
            )
        return params

    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple; APIError 400 for a string with no UTF-8 form (a lone surrogate)."""
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        for stop in stops:
            try:
                stop.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise APIError(
                    f"the stop contains an invalid Unicode code point ({exc.reason}, "
                    f"{stop[exc.start]!r} at offset {exc.start})",
                    param="stop",
                ) from None
        return stops

    def token_limit(self) -> tuple[int | None, str]:
        """(the requested most new tokens or None, the field that asked)."""
        return self.max_tokens, "max_tokens"  # type: ignore[attr-defined]

    def to_requests(
        self,
        prompts: Sequence[Sequence[int]],
        settings: Settings,
        *,
        ctx_size: int,
        vocab_size: int,
        choices: int,
        id_prefix: str,
        prompt_param: str,
    ) -> tuple[list[Request], int]:
        """One engine request per (prompt, choice), and the base seed (choice i uses seed + i).

        Every request is made by `build_request`, as on every surface: the body's sampler (built once
        for all choices), its token limit or else the server's `n_predict`. The first request
        resolves the seed (the body's, or a random one) and choice i of the body draws with
        seed + i, so one reported seed replays every choice. A prompt that does not fit the
        context, or a token limit that cannot fit beside the prompt, is APIError 400 (as OpenAI and
        vLLM answer); an omitted limit means up to the context end (or the server's `--n-predict`).
        """
        params = self.to_sampling_params(settings, vocab_size)
        grammar: GrammarSpec | Literal["settings"] | None = self.grammar_spec()
        if grammar is None and not self.asks_free_text():
            grammar = FROM_SETTINGS  # no format field: the server's own constraint setting, if any
        spec = self.to_spec_config(settings)
        limit, limit_param = self.token_limit()
        requests: list[Request] = []
        base_seed = 0  # the first request's seed, once it is made
        for p, ids in enumerate(prompts):
            if len(ids) >= ctx_size:
                raise APIError(
                    f"This model's maximum context length is {ctx_size} tokens, but the {prompt_param} "
                    f"has {len(ids)} tokens (at least one must be left to generate).",
                    param=prompt_param,
                    code="context_length_exceeded",
                )
            room = ctx_size - len(ids)
            if limit is not None and limit > room:
                raise APIError(
                    f"{limit_param} is too large: {limit}. This model's maximum context length is "
                    f"{ctx_size} tokens and the {prompt_param} has {len(ids)} tokens, so at most {room} "
                    "can be generated.",
                    param=limit_param,
                    code="context_length_exceeded",
                )
            for i in range(choices):
                index = p * choices + i
                seed = None if not requests else (base_seed + index) % _SEED_SPACE
                try:
                    request = build_request(
                        ids,
                        settings,
                        sampling=params,
                        max_tokens=limit,
                        stop=self.stop_strings(),
                        ignore_eos=self.ignore_eos,
                        seed=seed,
                        request_id=f"{id_prefix}-{index}",
                        grammar=grammar,
                        spec=spec,
                    )
                except RequestError as exc:
                    param = limit_param if exc.parameter == "max_tokens" else exc.parameter
                    if exc.parameter == "prompt":
                        param = prompt_param
                    message = str(exc).replace("max_tokens", limit_param)
                    raise APIError(message, param=param) from None
                if self._shown_special:
                    request = dataclasses.replace(request, shown_special_ids=self._shown_special)
                if not requests:
                    base_seed = int(request.seed or 0)  # an int: the request resolved it
                requests.append(request)
        if not requests:
            raise APIError(f"{prompt_param} must not be empty", param=prompt_param)
        return requests, base_seed


# -- chat ----------------------------------------------------------------------------------------
Role = Literal[tuple(sorted(VALID_ROLES))]  # type: ignore[valid-type]


class ContentPart(BaseModel):
    """A content part; only `{"type": "text", "text": ...}` is supported (the chat template checks)."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: Optional[StrictStr] = None


class ChatMessage(BaseModel):
    """One chat message. Extra keys (`name`, `tool_calls`, ...) are passed to the chat template."""

    model_config = ConfigDict(extra="allow")
    role: Role
    content: Union[StrictStr, Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)], None] = None


class JsonSchemaFormat(BodyModel):
    """A named JSON schema (`response_format.json_schema`, or `text.format` itself on responses)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: Optional[StrictStr] = None
    description: Optional[StrictStr] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema", description="The JSON schema.")
    strict: Optional[StrictBool] = Field(
        None,
        description="Accepted either way: the schema is always enforced token by token, and a schema "
        "feature that cannot be enforced is refused (400).",
    )


class ResponseFormat(JsonSchemaFormat):
    """`response_format` (chat completions) or `text.format` (responses): `text`, `json_object` (any
    JSON object) or `json_schema` (the schema under `json_schema` on chat, at the top on responses)."""

    type: StrictStr = "text"
    json_schema: Optional[JsonSchemaFormat] = None

    def grammar_spec(self, param: str) -> GrammarSpec | None:
        """The constraint this format asks for (None for text); APIError 400 naming the field."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return GrammarSpec("json_object", parameter=param)
        if self.type != "json_schema":
            raise APIError(
                f"{param} type {self.type!r} is not supported (text, json_object or json_schema)",
                param=f"{param}.type",
            )
        holder, where = (self.json_schema, f"{param}.json_schema") if self.json_schema else (self, param)
        if holder.schema_ is None:
            raise APIError(f"{where}.schema is required for type json_schema", param=f"{where}.schema")
        try:
            return GrammarSpec.json_schema(holder.schema_, parameter=f"{where}.schema")
        except GrammarError as exc:
            raise APIError(str(exc), param=exc.parameter, code=INVALID_GRAMMAR) from None


class ChatCompletionRequest(Generation):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(
        min_length=1, max_length=MAX_MESSAGES, description="The conversation so far."
    )
    n: StrictInt = Field(1, ge=1, le=128, description="Choices to generate (choice i uses seed + i).")
    max_tokens: Optional[StrictInt] = Field(None, description="Deprecated name of max_completion_tokens.")
    max_completion_tokens: Optional[StrictInt] = Field(
        None, description="Most tokens to generate; omitted = up to the end of the context."
    )
    logprobs: Optional[StrictBool] = Field(None, description="Return each token's log-probability.")
    top_logprobs: Optional[StrictInt] = Field(
        None, ge=0, le=20, description="Alternatives per token (needs logprobs: true)."
    )
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[dict[str, Any]]] = Field(
        None, max_length=MAX_TOOLS, description="Function tools the model may call (JSON-schema parameters)."
    )
    tool_choice: Optional[Union[StrictStr, dict[str, Any]]] = Field(
        None,
        description="none, auto (the default with tools), required, or {type: function, function: {name}}; "
        "required and a named function generate under a grammar that allows only valid calls.",
    )
    parallel_tool_calls: Optional[StrictBool] = Field(
        None, description="Whether one reply may hold several calls (default true)."
    )

    def tool_choice_of(self) -> ToolChoice | None:
        """The body's tools and choice, checked (APIError 400 naming the field)."""
        return read_tool_choice(self.tools, self.tool_choice, self.parallel_tool_calls, flat=False)

    def token_limit(self) -> tuple[int | None, str]:
        """max_completion_tokens wins over the deprecated max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def logprob_count(self) -> int | None:
        """`top_logprobs` when `logprobs` is on."""
        if self.top_logprobs and not self.logprobs:
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def check_supported(self) -> None:
        """Refuse what this server cannot honour, rather than silently ignore it."""
        super().check_supported()

    def format_spec(self) -> GrammarSpec | None:
        """`response_format`."""
        fmt = self.response_format
        return None if fmt is None else fmt.grammar_spec("response_format")

    def asks_free_text(self) -> bool:
        """`response_format` type text."""
        return self.response_format is not None and self.response_format.type == "text"

    def format_spec_given(self) -> bool:
        """`response_format` other than text."""
        return self.response_format is not None and self.response_format.type != "text"

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as plain dicts for the chat template."""
        return [m.model_dump(exclude_none=True) | {"content": _content(m.content)} for m in self.messages]


def _content(content: Any) -> Any:
    if isinstance(content, list):
        return [
            part.model_dump(exclude_none=True) if isinstance(part, BaseModel) else part for part in content
        ]
    return content


# -- completions ---------------------------------------------------------------------------------
TokenIds = Annotated[list[StrictInt], Field(max_length=MAX_PROMPT_TOKEN_IDS)]
PromptInput = Union[
    StrictStr,
    Annotated[list[StrictStr], Field(max_length=MAX_PROMPTS)],
    TokenIds,
    Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)],
]


class CompletionRequest(Generation):
    """POST /v1/completions."""

    prompt: PromptInput = Field(description="Text, token ids, or a list of either (one completion each).")
    n: StrictInt = Field(1, ge=1, le=128, description="Choices per prompt (choice i uses seed + i).")
    max_tokens: Optional[StrictInt] = Field(
        None, description="Most tokens to generate; omitted = up to the end of the context."
    )
    logprobs: Optional[StrictInt] = Field(None, ge=0, le=5, description="Alternatives per token to return.")
    echo: StrictBool = Field(False, description="Prepend the prompt to the completion text.")
    suffix: Optional[StrictStr] = None
    best_of: Optional[StrictInt] = None

    def logprob_count(self) -> int | None:
        """`logprobs` is the number of alternatives."""
        return self.logprobs

    def check_supported(self) -> None:
        """Refuse what this server cannot honour."""
        super().check_supported()
        if self.suffix:
            raise APIError("suffix (insertion) is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError("best_of other than n is not supported", param="best_of")
        choices = len(self.prompt_list()) * self.n
        if choices > MAX_PROMPTS:
            raise APIError(
                f"{len(self.prompt_list())} prompts with n = {self.n} ask for {choices} completions; at "
                f"most {MAX_PROMPTS} are accepted in one request",
                param="n",
            )

    def prompt_list(self) -> list[str | list[int]]:
        """Every prompt, as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]
