"""Structured output: constraints (JSON schema, any JSON object, regex, Lark grammar, choice list)
as per-position token masks, through llguidance.

`spec.py` holds what a request asks for (tokenizer-free, checked at construction), `vocabulary.py`
the per-model token table (built once, verified against our tokenizer), `constraint.py` the
per-request matcher the step loop masks, advances and rolls back.
"""

from infer.engine.grammar.constraint import Constraint, GrammarViolationError, audit_tokens
from infer.engine.grammar.spec import GRAMMAR_KINDS, GrammarError, GrammarKind, GrammarSpec
from infer.engine.grammar.vocabulary import GrammarVocabulary, VocabularyMismatchError

__all__ = [
    "GRAMMAR_KINDS",
    "Constraint",
    "GrammarError",
    "GrammarKind",
    "GrammarSpec",
    "GrammarViolationError",
    "GrammarVocabulary",
    "VocabularyMismatchError",
    "audit_tokens",
]
