"""Constrained decoding: regex, JSON schema, EBNF, Lark and choices as token masks.

    SamplingParams --grammar--> GrammarSpec --GrammarCompiler--> CompiledGrammar
      --new_matcher--> GrammarMatcher (per request; the scheduler fills its bitmask
      row each step, accepts sampled tokens, and asks it for jump-forward text)

Backends (``registry.REGISTRY``: ``llguidance``, ``xgrammar``, ``outlines``) are imported
when first used.
"""

from radixlm.runtime.constrained.base import CompiledGrammar, GrammarBackend, GrammarMatcher
from radixlm.runtime.constrained.compiler import GrammarCompiler
from radixlm.runtime.constrained.jump_forward import JumpForward
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary

__all__ = [
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarCompiler",
    "GrammarMatcher",
    "GrammarSpec",
    "JumpForward",
    "TokenVocabulary",
]
