"""What a JSON schema's numbers may be when generated: at most 16 integral digits, as llama.cpp.

llguidance compiles `{"type": "integer"}` to `-?(0|[1-9][0-9]*)`: any number of digits, so a small
model that starts a population can write digits until the token limit. llama.cpp's
`json-schema-to-grammar` caps them (`integral-part ::= [0] | [1-9] [0-9]{0,15}`, `decimal-part ::=
[0-9]{1,16}`). llguidance has no option for that, so :func:`bound_numbers` writes the caps into the
schema as bounds llguidance enforces, before it is compiled:

- an `integer` without a lower (upper) bound gets `minimum: -(10**16 - 1)` (`maximum: 10**16 - 1`),
  the range of 16 digits; a bound the schema gives is kept, whatever its size;
- a `number` gets the same range, and `multipleOf: 1e-10` unless it has a `multipleOf`: at most
  10 decimals (llguidance's decimal `multipleOf` stops at about 10 digits: float precision) and no
  exponent (llguidance's numeric ranges are written without one), where llama.cpp allows 16
  decimals and a 16-digit exponent.

A value the schema leaves open (`{}`, `true`, an object's `additionalProperties` left out or `true`,
an array's `items` left out or `true`) would be llguidance's own any-JSON value, unbounded numbers
included; it becomes a reference to :data:`ANY_VALUE` (any JSON value, with bounded numbers), added to
the schema's `$defs`. `response_format: json_object` is :data:`ANY_OBJECT`.

The schema a request gave is what its errors and labels show; only the compiled grammar is bounded.
"""

from __future__ import annotations

from typing import Any

INTEGRAL_DIGITS = 16
"""llama.cpp's cap on the digits of an integer, and of a number's integral part."""

INTEGRAL_LIMIT = 10**INTEGRAL_DIGITS - 1
"""The largest magnitude of INTEGRAL_DIGITS digits: the bound added where a schema gives none."""

DECIMAL_STEP = 1e-10
"""The `multipleOf` added to a `number` without one: at most 10 decimals."""

ANY_VALUE_NAME = "infer_json_value"
"""The `$defs` entry of the bounded any-JSON value."""

_ANY_REF = {"$ref": f"#/$defs/{ANY_VALUE_NAME}"}

ANY_VALUE: dict[str, Any] = {
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},  # an integer is a number: one alternative, so no ambiguity to resolve
        {"type": "string"},
        {"type": "array"},  # items and additionalProperties: this value again, once bounded
        {"type": "object"},
    ]
}
"""Any JSON value, as :func:`bound_numbers` writes it into `$defs` (bounded there)."""

ANY_OBJECT: dict[str, Any] = {"type": "object"}
"""Any JSON object: the schema of `response_format: json_object` (its values become ANY_VALUE)."""

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$schema",
        "deprecated",
        "readOnly",
        "writeOnly",
        "x-guidance",  # the layout: json_layout.py reads it before the numbers are bounded
    }
)
"""Keywords that constrain nothing: a schema of only these accepts any value."""

_SCHEMA_VALUED = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "then",
    "else",
)
"""Keywords whose value is one subschema that generates (or, for `items` in old drafts, a list of
them). `not`, `if` and `propertyNames` are left as they are: they judge a value rather than make
one, and a bound inside `not` would allow what the schema forbids."""

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to subschemas."""

_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
"""Keywords whose value is a list of subschemas."""


def bound_numbers(schema: Any) -> Any:
    """A copy of `schema` whose integers and numbers carry the digit caps of the module docstring,
    and whose open values are :data:`ANY_VALUE` (every subschema reached through the keywords above;
    anything else is copied as it is)."""
    used: list[bool] = []
    bounded = _bound(schema, used)
    if not used:
        return bounded
    definitions = dict(bounded.get("$defs", {}))
    definitions[ANY_VALUE_NAME] = _bound(ANY_VALUE, [])
    return {**bounded, "$defs": definitions}


def _is_open(schema: Any) -> bool:
    """`schema` accepts any JSON value (`true`, `{}`, or only annotations)."""
    return schema is True or (isinstance(schema, dict) and set(schema) <= _ANNOTATIONS)


def _kinds(schema: dict[str, Any]) -> set[str]:
    """The names in a schema's `type` (a string or a list; none when it has no `type`)."""
    kinds = schema.get("type")
    return {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()


def _bound(schema: Any, used: list[bool]) -> Any:
    """bound_numbers for one subschema; appends to `used` when it refers to ANY_VALUE."""
    if isinstance(schema, list):
        return [_bound(item, used) for item in schema]
    if _is_open(schema):
        used.append(True)
        return dict(_ANY_REF)
    if not isinstance(schema, dict):
        return schema
    bounded = dict(schema)
    kinds = _kinds(bounded)
    if "object" in kinds:
        bounded.setdefault("additionalProperties", True)
    if "array" in kinds and "prefixItems" not in bounded:  # after prefixItems: llguidance's own
        bounded.setdefault("items", True)
    for key in _SCHEMA_VALUED + _SCHEMA_LISTS:
        if key in bounded:
            bounded[key] = _bound(bounded[key], used)
    for key in _SCHEMA_MAPS:
        if isinstance(bounded.get(key), dict):
            bounded[key] = {name: _bound(sub, used) for name, sub in bounded[key].items()}
    if kinds & {"integer", "number"}:
        if "minimum" not in bounded and "exclusiveMinimum" not in bounded:
            bounded["minimum"] = -INTEGRAL_LIMIT
        if "maximum" not in bounded and "exclusiveMaximum" not in bounded:
            bounded["maximum"] = INTEGRAL_LIMIT
        if "number" in kinds and "multipleOf" not in bounded:
            bounded["multipleOf"] = DECIMAL_STEP
    return bounded


__all__ = ["ANY_OBJECT", "ANY_VALUE", "DECIMAL_STEP", "INTEGRAL_DIGITS", "INTEGRAL_LIMIT", "bound_numbers"]
