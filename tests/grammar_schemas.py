"""Ten JSON schemas for the structured-output tests on the default model, each with a prompt.

Every one is bounded (strings with maxLength, arrays with maxItems, integers with bounds, numbers
with bounds and few digits by pattern-free ranges) so a completion fits a small token budget.
"""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "nested_object": (
        "Describe a book as JSON with its author.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 12},
                "author": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 10},
                        "born": {"type": "integer", "minimum": 1500, "maximum": 2020},
                    },
                    "required": ["name", "born"],
                    "additionalProperties": False,
                },
            },
            "required": ["title", "author"],
            "additionalProperties": False,
        },
    ),
    "bounded_array": (
        "List a few colours as JSON.",
        {
            "type": "object",
            "properties": {
                "colours": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 8},
                    "minItems": 2,
                    "maxItems": 3,
                }
            },
            "required": ["colours"],
            "additionalProperties": False,
        },
    ),
    "enum": (
        "What is the weather like? Answer as JSON.",
        {
            "type": "object",
            "properties": {"sky": {"enum": ["sunny", "cloudy", "rainy"]}, "windy": {"type": "boolean"}},
            "required": ["sky", "windy"],
            "additionalProperties": False,
        },
    ),
    "integer_bounds": (
        "Give a person's age and height in cm as JSON.",
        {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "height": {"type": "integer", "exclusiveMinimum": 50, "exclusiveMaximum": 250},
            },
            "required": ["age", "height"],
            "additionalProperties": False,
        },
    ),
    "number_bounds": (
        "Give a temperature reading as JSON.",
        {
            "type": "object",
            "properties": {"celsius": {"type": "number", "minimum": -40, "maximum": 60}},
            "required": ["celsius"],
            "additionalProperties": False,
        },
    ),
    "optional_fields": (
        "Describe a pet as JSON.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "species": {"type": "string", "maxLength": 8},
                "age": {"type": "integer", "minimum": 0, "maximum": 30},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    ),
    "string_pattern": (
        "Give a product code and a date as JSON.",
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            },
            "required": ["code", "date"],
            "additionalProperties": False,
        },
    ),
    "defs_ref": (
        "Give two points of a line as JSON.",
        {
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {
                        "x": {"type": "integer", "minimum": -9, "maximum": 9},
                        "y": {"type": "integer", "minimum": -9, "maximum": 9},
                    },
                    "required": ["x", "y"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
            "required": ["start", "end"],
            "additionalProperties": False,
        },
    ),
    "any_of": (
        "Give an id as JSON: a number or a short name.",
        {
            "type": "object",
            "properties": {
                "id": {
                    "anyOf": [
                        {"type": "integer", "minimum": 0, "maximum": 999},
                        {"type": "string", "maxLength": 6},
                    ]
                }
            },
            "required": ["id"],
            "additionalProperties": False,
        },
    ),
    "array_of_objects": (
        "List two cities with their population in millions as JSON.",
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 8},
                    "millions": {"type": "integer", "minimum": 0, "maximum": 40},
                },
                "required": ["city", "millions"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
    ),
}
