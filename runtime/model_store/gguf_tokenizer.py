"""A GGUF's vocabulary (``tokenizer.ggml.*``) rebuilt as a Hugging Face ``tokenizers``
tokenizer that encodes text to the ids the model's own tokenizer.json gave, as llama.cpp does::

    tokenizer.ggml.model  vocabulary                      rebuilt as
    llama                 SentencePiece BPE: Llama 2,     BPE over every split of a token into
                          Mistral, Mixtral, Phi-3,        two tokens, the best-scored join first
                          Gemma 2/3                       (SentencePiece's own order; the file's
                                                          merges if it has them); a byte outside
                                                          the vocabulary as its <0xXX> token;
                                                          spaces as U+2581, one more in front
                                                          unless add_space_prefix is false
    gpt2                  byte-level BPE: Llama 3,        the file's merges over the pieces the
                          Qwen2/3, OLMoE, DeepSeek,       ``tokenizer.ggml.pre`` regexes cut the
                          SmolLM, GPT-2                   text into (``BPE_PRE_TOKENIZERS``)

Gemma differs from Llama only in what its file says: no space prefix, and its whitespace runs
are user-defined tokens of real spaces (the converter's spelling), matched whole in a text.

Where the file is silent, llama.cpp's defaults hold: a SentencePiece vocabulary adds BOS
(id 1; EOS 2, UNK 0) and a space prefix, Llama 3's (``llama-bpe``) adds BOS too. Control and
unknown tokens become special tokens; user-defined ones plain added tokens, matched whole
anywhere in a text, as llama.cpp matches them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gguf
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from radixlm.runtime.errors import ModelLoadError

__all__ = ["BPE_PRE_TOKENIZERS", "BPEPreTokenizer", "GGUFVocab", "build_tokenizer", "read_vocab"]

_TYPE = gguf.TokenType
_SPACE = "\u2581"  # SentencePiece's visible space


@dataclass(frozen=True)
class BPEPreTokenizer:
    """How one of llama.cpp's pre-tokenizers (``tokenizer.ggml.pre``) cuts text before the
    merges run, as the model's own tokenizer.json did.

    regexes: applied in turn, as llama.cpp's ``unicode_regex_split`` applies them: every
        match and every gap between matches becomes a piece of its own.
    ignore_merges: a piece that is itself a token stays whole (Llama 3's ``ignore_merges``).
    add_bos: llama.cpp's add_bos when the file does not say.
    nfc: the original normalizes text to NFC first (Qwen2; llama.cpp does not).
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False
    nfc: bool = False


_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# DeepSeek LLM's letters: the cased ones of every script, spelled out by its tokenizer.json.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00"
    "-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_DEEPSEEK_PUNCTUATION = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_CJK = "\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff"  # CJK ideographs, Hangul (and what lies between)

_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT2_SPLITS = BPEPreTokenizer((_GPT2,))
_LLAMA3_SPLITS = BPEPreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_SPLITS = BPEPreTokenizer((_QWEN2,), nfc=True)

# Keyed by llama.cpp's name (``tokenizer.ggml.pre``); a wrong split silently changes ids.
BPE_PRE_TOKENIZERS: Mapping[str, BPEPreTokenizer] = {
    # llama.cpp's fallback for a byte-level vocabulary that names none
    "default": BPEPreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    "gpt-2": _GPT2_SPLITS,
    "olmo": _GPT2_SPLITS,
    "mpt": _GPT2_SPLITS,
    "llama-bpe": _LLAMA3_SPLITS,
    "llama3": _LLAMA3_SPLITS,
    "llama-v3": _LLAMA3_SPLITS,
    "falcon3": _LLAMA3_SPLITS,
    # Mistral NeMo, Mistral Small 3 (llama architecture)
    "tekken": BPEPreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    "qwen2": _QWEN2_SPLITS,
    "deepseek-r1-qwen": _QWEN2_SPLITS,
    "deepseek-llm": BPEPreTokenizer(
        (
            "[\r\n]",
            rf"\s?[{_DEEPSEEK_LETTERS}]+",
            rf"\s?[{_DEEPSEEK_PUNCTUATION}]+",
            r"\s+$",
            f"[{_CJK}]+",
            r"\p{N}+",
        )
    ),
    "deepseek-coder": BPEPreTokenizer(
        ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", f"[{_CJK}]+", r"\p{N}")
    ),
    # every digit on its own, then GPT-2's regex
    "smollm": BPEPreTokenizer((r"\p{N}", _GPT2)),
    "starcoder": BPEPreTokenizer((r"\p{N}", _GPT2)),
    "refact": BPEPreTokenizer((r"\p{N}", _GPT2)),
}


@dataclass(frozen=True)
class GGUFVocab:
    """The vocabulary a GGUF describes, llama.cpp's defaults filled in where it is silent.

    model: ``tokenizer.ggml.model``: ``llama`` (SentencePiece) or ``gpt2`` (byte-level BPE).
    pre: ``tokenizer.ggml.pre`` (byte-level BPE only; ``default`` when absent).
    tokens, token_types, scores: by id; types are ``gguf.TokenType``; SentencePiece joins
        the best-scored pair first (0 for every token when the file has no scores).
    merges: the file's merges, first applied first. A SentencePiece vocabulary has none,
        unless converted from a tokenizer.json alone (then its scores are placeholders).
    rstripped: marked tokens that swallow the whitespace after them in a text.
    """

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    scores: list[float]
    merges: list[tuple[str, str]]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    rstripped: frozenset[str] = frozenset()

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def read_vocab(meta: Mapping[str, Any]) -> GGUFVocab:
    """The vocabulary of a GGUF's metadata (every key -> its value).

    Raises:
        ModelLoadError: the vocabulary is neither SentencePiece (``llama``) nor byte-level BPE
            (``gpt2``), its pre-tokenizer is not one of ``BPE_PRE_TOKENIZERS``, or a key it
            needs is missing or malformed.
    """
    model = meta.get("tokenizer.ggml.model")
    if model not in _BUILDERS:
        raise ModelLoadError(
            f"GGUF tokenizer {model!r} is not supported (known: {sorted(_BUILDERS)})"
        )
    tokens = _tokens(meta)
    spm = model == "llama"
    pre = "default" if spm else meta.get("tokenizer.ggml.pre") or "default"
    if pre not in BPE_PRE_TOKENIZERS:
        raise ModelLoadError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {sorted(BPE_PRE_TOKENIZERS)})"
        )

    def special(key: str, default: int | None) -> int | None:
        token_id = meta.get(f"tokenizer.ggml.{key}", default)
        return token_id if token_id is not None and token_id < len(tokens) else None

    def flag(key: str, default: bool) -> bool:
        return bool(meta.get(f"tokenizer.ggml.{key}", default))

    return GGUFVocab(
        model=model,
        pre=pre,
        tokens=tokens,
        token_types=[int(t) for t in _per_token(meta, "token_type", len(tokens), _TYPE.NORMAL)],
        scores=[float(s) for s in _per_token(meta, "scores", len(tokens), 0.0)],
        merges=_merges(meta, spm),
        bos_id=special("bos_token_id", 1 if spm else None),
        eos_id=special("eos_token_id", 2 if spm else None),
        unk_id=special("unknown_token_id", 0 if spm else None),
        pad_id=special("padding_token_id", None),
        add_bos=flag("add_bos_token", spm or BPE_PRE_TOKENIZERS[pre].add_bos),
        add_eos=flag("add_eos_token", False),
        add_space_prefix=flag("add_space_prefix", spm),
        rstripped=_rstripped(meta, tokens),
    )


def build_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """The tokenizer ``vocab`` describes: its model, normalizer, pre-tokenizer and decoder, BOS
    and EOS as the vocabulary adds them, control and unknown tokens special."""
    tokenizer = _BUILDERS[vocab.model](vocab)
    if (template := _bos_eos_template(vocab)) is not None:
        tokenizer.post_processor = template
    _add_marked_tokens(tokenizer, vocab)
    return tokenizer


def _require(meta: Mapping[str, Any], key: str) -> Any:
    if key not in meta:
        raise ModelLoadError(f"GGUF metadata has no {key!r}")
    return meta[key]


def _tokens(meta: Mapping[str, Any]) -> list[str]:
    tokens = list(_require(meta, "tokenizer.ggml.tokens"))
    if len(set(tokens)) != len(tokens):  # llama.cpp refuses these too
        raise ModelLoadError("GGUF vocabulary holds the same token twice")
    return tokens


def _per_token(meta: Mapping[str, Any], key: str, count: int, default: Any) -> list[Any]:
    values = meta.get(f"tokenizer.ggml.{key}")
    if values is None:
        return [default] * count
    if len(values) < count:
        raise ModelLoadError(
            f"GGUF tokenizer.ggml.{key} has {len(values)} values for {count} tokens"
        )
    return list(values[:count])


def _rstripped(meta: Mapping[str, Any], tokens: list[str]) -> frozenset[str]:
    # Phi-3's tokenizer.json has its chat and placeholder tokens (and </s>) take the
    # whitespace after them along; llama.cpp does the same by the model's name.
    if meta.get("general.architecture") != "phi3":
        return frozenset()
    types = meta.get("tokenizer.ggml.token_type") or []
    marked = {t for t, kind in zip(tokens, types) if kind != _TYPE.NORMAL}
    return frozenset(marked - {"<unk>", "<s>", "<|endoftext|>"})


def _merges(meta: Mapping[str, Any], spm: bool) -> list[tuple[str, str]]:
    """The file's merges; a SentencePiece vocabulary may have none (its scores rank them)."""
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None and not spm:
        raise ModelLoadError("GGUF metadata has no 'tokenizer.ggml.merges'")
    return [_merge(merge) for merge in merges or []]


def _merge(merge: str) -> tuple[str, str]:
    # As llama.cpp reads them: cut at the first space after the first character.
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ModelLoadError(f"GGUF merge {merge!r} is not two tokens")
    return merge[:cut], merge[cut + 1 :]


# --- SentencePiece ---------------------------------------------------------------------------


def _sentencepiece(vocab: GGUFVocab) -> Tokenizer:
    ids = {token: index for index, token in enumerate(vocab.tokens)}
    model = models.BPE(
        vocab=ids,
        merges=vocab.merges or _merges_by_score(vocab, ids),
        unk_token=vocab.token(vocab.unk_id),
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    # A Prepend normalizer, not Metaspace's prepend: llama.cpp (and Llama 2's tokenizer.json)
    # put U+2581 before every text, even one that starts with a space, and again after every
    # special or added token; Metaspace skips a text that starts with one.
    prefix = [normalizers.Prepend(_SPACE)] if vocab.add_space_prefix else []
    tokenizer.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", _SPACE)])
    strip = [decoders.Strip(" ", 1, 0)] if vocab.add_space_prefix else []
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tokenizer


def _merges_by_score(vocab: GGUFVocab, ids: Mapping[str, int]) -> list[tuple[str, str]]:
    """Every split of a normal token into two tokens, the best-scored token's splits first.

    SentencePiece (and llama.cpp) join, of all adjacent pairs, the one whose join is the
    best-scored token; BPE joins the pair that comes first here, which is the same pair.
    Equal scores (Llama 2's whitespace runs) keep the vocabulary's order, and a token's
    splits the order of their parts' ids: the order transformers' converter wrote Llama 2's
    tokenizer.json in, and the one that matches llama.cpp's leftmost-first on such ties.
    """
    ranked: list[tuple[float, int, int, int, int]] = []
    for index, token in enumerate(vocab.tokens):
        if vocab.token_types[index] != _TYPE.NORMAL:
            continue
        for cut in range(1, len(token)):
            left, right = ids.get(token[:cut]), ids.get(token[cut:])
            if left is not None and right is not None:
                ranked.append((-vocab.scores[index], index, left, right, cut))
    ranked.sort()
    return [(vocab.tokens[i][:cut], vocab.tokens[i][cut:]) for _, i, _, _, cut in ranked]


# --- byte-level BPE --------------------------------------------------------------------------


def _byte_level(vocab: GGUFVocab) -> Tokenizer:
    splits = BPE_PRE_TOKENIZERS[vocab.pre]
    ids = {token: index for index, token in enumerate(vocab.tokens)}
    model = models.BPE(
        vocab=ids, merges=vocab.merges, fuse_unk=False, ignore_merges=splits.ignore_merges
    )
    tokenizer = Tokenizer(model)
    if splits.nfc:
        tokenizer.normalizer = normalizers.NFC()
    pieces = [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in splits.regexes]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*pieces, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


_BUILDERS: dict[str, Callable[[GGUFVocab], Tokenizer]] = {
    "llama": _sentencepiece,
    "gpt2": _byte_level,
}


# --- both --------------------------------------------------------------------------------------


def _bos_eos_template(vocab: GGUFVocab) -> processors.TemplateProcessing | None:
    """BOS before and EOS after each sequence, as far as the vocabulary adds them."""
    bos = vocab.token(vocab.bos_id) if vocab.add_bos else None
    eos = vocab.token(vocab.eos_id) if vocab.add_eos else None
    if bos is None and eos is None:
        return None

    def sequence(name: str, part: int) -> str:
        return " ".join(f"{t}:{part}" for t in (bos, f"${name}", eos) if t is not None)

    marks = {bos: vocab.bos_id, eos: vocab.eos_id}
    return processors.TemplateProcessing(
        single=sequence("A", 0),
        pair=f"{sequence('A', 0)} {sequence('B', 1)}",
        special_tokens=[(t, i) for t, i in marks.items() if t is not None and i is not None],
    )


def _add_marked_tokens(tokenizer: Tokenizer, vocab: GGUFVocab) -> None:
    # Control and unknown tokens (<|im_start|>, <s>, ...) are matched whole and skipped when
    # decoding with skip_special_tokens; user-defined ones are matched whole but decoded as text.
    kinds = list(zip(vocab.tokens, vocab.token_types))
    special = [t for t, kind in kinds if kind in (_TYPE.CONTROL, _TYPE.UNKNOWN)]
    user = [t for t, kind in kinds if kind == _TYPE.USER_DEFINED]
    rstrip = vocab.rstripped
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False, rstrip=t in rstrip) for t in special]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False, rstrip=t in rstrip) for t in user]
    )
