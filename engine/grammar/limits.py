"""The bounds a constraint must fit before llguidance sees it, and the limits it is compiled and
matched under.

llguidance compiles grammars in native code that recurses once per nested rule or `$ref`, and a
recursion deeper than the thread's stack is a SIGSEGV that takes the whole process down, with no
Python exception to catch. Measured with llguidance 1.9.1 on an 8 MiB stack
(`python scripts/grammar_crash_limits.py`): a JSON schema `$defs` chain crashes at ~930 links of
`{"type": "object", "properties": {"a": {"$ref": next}}}` (~2,800 JSON levels) or ~2,500 bare
`{"$ref": next}` links; a Lark chain `rN: "tN" rN+1 | "tN"` at ~2,670 rules; a GBNF chain at the
same length (it becomes that Lark chain). Inline nesting stops earlier with an error, not a crash
(JSON at 128 levels, Lark parentheses at ~30, regex groups likewise). The bounds here sit 5-10x
below those figures; grammars within them also compile in the worker with an 8 MiB stack and are
matched in this process on a 64 MiB one, so a compile that fits the worker fits here with room.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from infer.engine.workers import WorkerLimits

MAX_GRAMMAR_BYTES = 256 * 1024
"""Longest constraint source (JSON schema text, regex, Lark or GBNF grammar, all choices together)."""
MAX_GRAMMAR_RULES = 512
"""Most rule and terminal definitions in a Lark or GBNF grammar (the native compiler crashed at
~2,670 in a chain on an 8 MiB stack; GBNF's converter is quadratic: 512 rules take ~0.5 s)."""
MAX_SCHEMA_DEPTH = 256
"""Deepest nesting of a JSON schema in JSON levels, a `$ref` counting as the depth of what it names
(a cycle counts once): the native compiler crashed at ~2,500-2,800."""
MAX_CHOICES = 4096
"""Most alternatives of a choice constraint."""

PARSER_LIMITS: dict[str, Any] = {"verbose_errors": False}
"""llguidance's parser limits for every compile and matcher: its defaults (lexer fuel per mask ~15
ms, Earley items per step, lexer states, grammar size), with errors that do not dump the parser's
internal state into a message a client reads."""

COMPILE_LIMITS = WorkerLimits(timeout_s=10.0, memory_mb=512, cpu_s=2.0, nice=10, stack_mb=8)
"""The compile worker: 2 CPU seconds and 512 MiB per grammar (a legitimate one takes milliseconds;
512 GBNF rules ~0.5 s), at low priority so it takes only spare CPU from the step loop, on an 8 MiB
stack whatever the shell's `ulimit -s`; 10 s of wall clock while the machine is busy."""

MATCHER_STACK_MB = 64
"""The stack of the thread that builds a request's matcher in this process: 8x the worker's, so a
grammar the worker compiled is far from this process's recursion limit."""

MASK_TIME_LIMIT_S = 0.5
"""Longest one token mask may take (a legitimate one takes under 5 ms with a 49k vocabulary); a
request whose mask takes longer ends (finish_reason error) rather than slowing every other one."""


class BoundsError(ValueError):
    """A constraint is larger or deeper than the bounds allow (the message says which and by how much)."""


def check_size(text: str, what: str) -> None:
    """BoundsError if `text` is longer than MAX_GRAMMAR_BYTES (UTF-8)."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise BoundsError(f"the {what} is {size} bytes; at most {MAX_GRAMMAR_BYTES} are accepted")


_LARK_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*[ \t]*(\[[^\]\n]*\])?[ \t]*:(?![:=])", re.M)


def count_rules(grammar: str) -> int:
    """How many rules and terminals `grammar` (Lark or GBNF) defines, counted generously: every
    `::=` (GBNF) and every line that starts with `name:` (Lark)."""
    return grammar.count("::=") + len(_LARK_DEFINITION.findall(grammar))


def check_grammar(grammar: str) -> None:
    """BoundsError if a Lark or GBNF grammar is too large, has too many rules, or embeds
    (`%json {...}`) a JSON schema that is too deep."""
    check_size(grammar, "grammar")
    rules = count_rules(grammar)
    if rules > MAX_GRAMMAR_RULES:
        raise BoundsError(f"the grammar defines {rules} rules; at most {MAX_GRAMMAR_RULES} are accepted")
    for schema in _embedded_schemas(grammar):
        check_schema(schema, "JSON schema inside the grammar")


def _embedded_schemas(grammar: str) -> Iterator[Any]:
    """The JSON values after each `%json` in a Lark grammar (llguidance compiles them as schemas)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"%json\s*", grammar):
        try:
            value, _ = decoder.raw_decode(grammar, match.end())
        except (ValueError, RecursionError):
            continue  # not JSON: llguidance refuses it itself
        yield value


def check_schema(schema: Any, what: str = "JSON schema") -> None:
    """BoundsError if `schema` nests deeper than MAX_SCHEMA_DEPTH."""
    depth = schema_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise BoundsError(
            f"the {what} nests {depth} levels deep (following $ref); at most {MAX_SCHEMA_DEPTH} are accepted"
        )


def schema_depth(root: Any) -> int:
    """The nesting depth of a JSON document in levels, where a `{"$ref": ...}` naming a part of the
    same document (`#/json/pointer`, an `$anchor` as `#name`, or an `$id`) counts as that part's
    depth, and a reference back into a part still being measured (a recursive schema) as nothing.
    Iterative, and each part is measured once, so it is linear in the document's size."""
    targets = _ref_targets(root)
    memo: dict[int, int] = {}
    active: set[int] = set()
    # Each frame: (node, its children still to visit, the deepest child so far).
    stack: list[tuple[Any, Iterator[Any], int]] = []

    def enter(node: Any) -> int | None:
        """The node's depth if known without visiting children, else None after pushing it."""
        if not isinstance(node, (dict, list)):
            return 0
        if id(node) in memo:
            return memo[id(node)]
        if id(node) in active:
            return 0
        active.add(id(node))
        stack.append((node, iter(_children(node, targets)), 0))
        return None

    result = enter(root)
    last = 0
    while stack:
        node, children, deepest = stack[-1]
        child = next(children, _END)
        if child is _END:
            stack.pop()
            active.discard(id(node))
            memo[id(node)] = last = deepest + 1
            if stack:
                parent, rest, best = stack[-1]
                stack[-1] = (parent, rest, max(best, last))
            continue
        known = enter(child)
        if known is not None:
            stack[-1] = (node, children, max(deepest, known))
    return result if result is not None else last


_END = object()


def _children(node: Any, targets: dict[str, Any]) -> Iterator[Any]:
    """The values inside `node`, then what its `$ref` names (when it names a part of the document)."""
    yield from node.values() if isinstance(node, dict) else node
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str):
        target = targets.get(ref)
        if target is None and ref.startswith("#/"):
            target = _pointer(targets["#"], ref[2:])
        if target is not None:
            yield target


def _ref_targets(root: Any) -> dict[str, Any]:
    """`$ref` strings that name a part of `root` without a JSON pointer: `#` (the root), `#anchor`,
    and each `$id` (as written, and as `$id#anchor`)."""
    targets: dict[str, Any] = {"#": root}
    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            anchor, ident = node.get("$anchor"), node.get("$id")
            if isinstance(anchor, str):
                targets[f"#{anchor}"] = node
            if isinstance(ident, str):
                targets[ident] = targets[ident.rstrip("#")] = node
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return targets


def _pointer(root: Any, pointer: str) -> Any:
    """The part of `root` at a JSON pointer (without its leading `#/`), or None."""
    node = root
    for raw in pointer.split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node
