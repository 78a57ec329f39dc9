"""GBNF grammars as llama.cpp reads them, and a matcher that says which tokens they allow.

grammar = parse_grammar(text)                    # GrammarError names line and column
matcher = GrammarMatcher(grammar, vocab)         # vocab: GrammarVocab.from_tokenizer(tok)
matcher.allows(token); matcher.mask(); matcher.accept(token)
json_schema_to_grammar(schema)                   # JsonSchemaError names the JSON path
"""

from .. import kernel_cache  # noqa: F401  (first: the kernels' disk cache locator)
from .json_schema import JsonSchemaWarning, json_schema_to_grammar
from .matcher import GrammarMatcher, GrammarVocab
from .parser import Grammar, GrammarError, parse_grammar, parse_rules
from .schema_nodes import JsonSchemaError

__all__ = [
    "Grammar",
    "GrammarError",
    "GrammarMatcher",
    "GrammarVocab",
    "JsonSchemaError",
    "JsonSchemaWarning",
    "json_schema_to_grammar",
    "parse_grammar",
    "parse_rules",
]
