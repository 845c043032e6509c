"""GGUF vocabularies back into tokenizers (``gguf_tokenizer``), for each kind a served family
uses: a small tokenizer built the way that family's tokenizer.json is built, its vocabulary
written into a GGUF as llama.cpp's converter writes it, and the tokenizer rebuilt from the file
(and served through transformers, as radixlm loads it) must encode a set of tricky texts to
the same ids and decode them to the same text::

    family        vocabulary                                       what the file leaves out
    llama2        SentencePiece BPE, byte fallback, space prefix,  add_bos, add_space_prefix
                  whitespace runs scored -1e9 (as Llama 2's)       (llama.cpp: both on)
    llama2-json   the same from its tokenizer.json alone: merges   the scores (all -1000)
    gemma         SentencePiece BPE, byte fallback, no prefix       -
    llama3        byte-level BPE, Llama 3's regex, ignore_merges   add_bos (llama-bpe: on)
    qwen2         byte-level BPE, Qwen2's regex, NFC               -
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import transformers
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.model_store.gguf_arch import open_gguf
from radixlm.runtime.model_store.gguf_convert import write_hf_metadata
from radixlm.runtime.model_store.gguf_tokenizer import build_tokenizer, read_vocab

T = gguf.TokenType
SPACE = "\u2581"
CORPUS = [
    "Hello world! Hello, world. The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've done it; don't you think? It's 12:30 on 2024-05-17.",
    "    def tokenize(text):\n        return [t for t in text.split()]\n\n",
    "Numbers 0123456789 and 3.14159, 1000000 and 42 are common in text.",
    "Äpfel und Birnen, façade, naïve café, résumé, Straße, Ελληνικά, русский язык.",
    "日本語のテキストと中文文本，还有한국어도 있어요。",
    "Tabs\tand\tnewlines\n\n\nand   multiple   spaces   are   here.",
] * 4
TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello  world   ",
    "   leading spaces",
    "trailing newline\n",
    "\n\nnew\nlines\n\n",
    "\ttab\tseparated",
    "digits 1234567 3.14 2024",
    "Äpfel façade naïve",
    "Ünïcödé combining: a\u0301e\u0308",  # NFC composes these (Qwen2)
    "日本語 中文 한국어",
    "emoji 🦙🚀 😶‍🌫️ 👍🏽",
    "bytes the vocabulary lacks: ☃ ζ ∑ ꙮ",
    "I'LL say it's fine, they've said",
    "code:    def f(x):\n        return x  # done",
]


@dataclass(frozen=True)
class Family:
    """A tokenizer as the family's tokenizer.json has it, and how the converter writes it."""

    name: str
    original: Tokenizer
    specials: list[str]  # texts of its special tokens, to put in texts
    write_vocabulary: Callable[[gguf.GGUFWriter], None]


# --- SentencePiece (Llama 2, Mistral, Gemma) --------------------------------------------------


def _pieces() -> list[str]:
    """SentencePiece-style pieces (U+2581 for a space, at word starts) learned from CORPUS:
    merged pieces in the order they were learned, then the single characters."""
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    learner.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    merges = json.loads(learner.to_str())["model"]["merges"]
    merged = list(dict.fromkeys("".join(merge) for merge in merges))
    chars = sorted(t for t in learner.get_vocab() if len(t) == 1)
    return merged + [c for c in chars if c not in merged]


def _splits_by_score(scores: dict[str, float], ids: dict[str, int]) -> list[tuple[str, str]]:
    """Merges as transformers' converter wrote Llama 2's tokenizer.json: each piece's splits
    into two tokens (by their parts' ids), the pieces best score first, ties in vocabulary
    order (``scores`` is in it; ``sorted`` keeps it)."""
    splits: list[tuple[str, str]] = []
    for piece in scores:
        cuts = [(piece[:cut], piece[cut:]) for cut in range(1, len(piece))]
        held = [pair for pair in cuts if pair[0] in ids and pair[1] in ids]
        splits += sorted(held, key=lambda pair: (ids[pair[0]], ids[pair[1]]))
    return sorted(splits, key=lambda pair: -scores["".join(pair)])


def _sentencepiece(name: str, space_prefix: bool, from_json: bool = False) -> Family:
    """Pieces scored as SentencePiece scores them (earlier learned, higher), turned into a
    tokenizer.json as transformers' converter does: BPE over every split of a piece into two
    pieces, best-scored piece first, byte fallback. ``from_json``: converted from its
    tokenizer.json alone (``_set_vocab_llama_hf``): merges written, every score -1000."""
    pieces = _pieces()
    scores = [-float(i) for i in range(len(pieces))]
    if space_prefix:  # Llama 2's whitespace runs: its first pieces, scored to be joined last
        runs = [SPACE * 2, SPACE * 4, SPACE * 8]
        pieces, scores = runs + pieces, [-1e9] * len(runs) + scores
    control = ["<s>", "</s>", "[INST]" if space_prefix else "<start_of_turn>"]
    tokens = ["<unk>", *control[:2], *(f"<0x{b:02X}>" for b in range(256)), control[2], *pieces]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.CONTROL]
    types += [T.NORMAL] * len(pieces)
    all_scores = [0.0] * (len(tokens) - len(pieces)) + scores
    ids = {token: i for i, token in enumerate(tokens)}
    merges = _splits_by_score(dict(zip(pieces, scores)), ids)
    model = models.BPE(ids, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    original = Tokenizer(model)
    prepend = [normalizers.Prepend(SPACE)] if space_prefix else []
    original.normalizer = normalizers.Sequence([*prepend, normalizers.Replace(" ", SPACE)])
    strip = [decoders.Strip(" ", 1, 0)] if space_prefix else []
    original.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    original.add_special_tokens([AddedToken(t, normalized=False) for t in ["<unk>", *control]])
    original.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)]
    )

    def write_vocabulary(w: gguf.GGUFWriter) -> None:
        """LlamaModel._set_vocab_sentencepiece: pieces, scores and types; no merges."""
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores([-1000.0] * len(tokens) if from_json else all_scores)
        w.add_token_types(types)
        if from_json:
            w.add_token_merges([f"{left} {right}" for left, right in merges])
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        if not space_prefix:  # Gemma's converter says both; older Llama files say neither
            w.add_add_space_prefix(False)
            w.add_add_bos_token(True)

    return Family(name, original, control, write_vocabulary)


# --- byte-level BPE (Llama 3, Qwen2) -----------------------------------------------------------

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(name: str, pre: str, control: list[str], user: list[str]) -> Family:
    """A byte-level BPE trained with the family's split regex (Llama 3: ignore_merges and
    BOS first; Qwen2: NFC), its special tokens added after the learned ones."""
    llama3 = pre == "llama-bpe"
    original = Tokenizer(models.BPE(ignore_merges=llama3))
    if not llama3:
        original.normalizer = normalizers.NFC()
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_REGEX if llama3 else QWEN2_REGEX), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    original.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    original.train_from_iterator(CORPUS, trainer)
    original.add_special_tokens([AddedToken(t, normalized=False) for t in control])
    original.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    bos = original.token_to_id(control[0])
    original.post_processor = (
        processors.TemplateProcessing(
            single=f"{control[0]}:0 $A:0",
            pair=f"{control[0]}:0 $A:0 {control[0]}:1 $B:1",
            special_tokens=[(control[0], bos)],
        )
        if llama3
        else processors.ByteLevel(trim_offsets=False)
    )
    tokens = [original.id_to_token(i) for i in range(original.get_vocab_size())]
    merges = [" ".join(pair) for pair in json.loads(original.to_str())["model"]["merges"]]

    def write_vocabulary(w: gguf.GGUFWriter) -> None:
        """TextModel._set_vocab_gpt2: special added tokens CONTROL, the others USER_DEFINED."""
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        kinds = {**dict.fromkeys(control, T.CONTROL), **dict.fromkeys(user, T.USER_DEFINED)}
        w.add_token_types([kinds.get(token, T.NORMAL) for token in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(bos)
        w.add_eos_token_id(original.token_to_id(control[-1]))
        if not llama3:
            w.add_pad_token_id(bos)
            w.add_add_bos_token(False)

    return Family(name, original, control + user, write_vocabulary)


FAMILIES: dict[str, Callable[[], Family]] = {
    "llama2": lambda: _sentencepiece("llama2", space_prefix=True),
    "llama2-json": lambda: _sentencepiece("llama2-json", space_prefix=True, from_json=True),
    "gemma": lambda: _sentencepiece("gemma", space_prefix=False),
    "llama3": lambda: _byte_level(
        "llama3", "llama-bpe", ["<|begin_of_text|>", "<|eot_id|>"], ["<think>"]
    ),
    "qwen2": lambda: _byte_level(
        "qwen2", "qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["<tool_call>"]
    ),
}


def _write_gguf(path: Path, family: Family) -> Path:
    """A one-layer llama GGUF around the family's vocabulary (the config is read too)."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    family.write_vocabulary(writer)
    rows = family.original.get_vocab_size()
    writer.add_tensor("token_embd.weight", np.zeros((rows, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[request.param]()


@pytest.fixture(scope="module")
def gguf_path(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_gguf(tmp_path_factory.mktemp(family.name) / "vocab.gguf", family)


def _texts(family: Family) -> list[str]:
    first, second = family.specials[0], family.specials[-1]
    return [*TEXTS, f"{first}special {second} in text{second}", f"{second}\n{first} x"]


def test_rebuilt_tokenizer_encodes_and_decodes_as_the_original(
    family: Family, gguf_path: Path
) -> None:
    meta = {name: field.contents() for name, field in gguf.GGUFReader(gguf_path).fields.items()}
    rebuilt = build_tokenizer(read_vocab(meta))
    assert rebuilt.get_vocab(with_added_tokens=True) == family.original.get_vocab(True)
    for text in _texts(family):
        for special in (True, False):
            want = family.original.encode(text, add_special_tokens=special).ids
            assert rebuilt.encode(text, add_special_tokens=special).ids == want, text
            for skip in (True, False):
                decoded = rebuilt.decode(want, skip_special_tokens=skip)
                assert decoded == family.original.decode(want, skip_special_tokens=skip), text


def test_served_tokenizer_is_the_original(family: Family, gguf_path: Path, tmp_path: Path) -> None:
    """write_hf_metadata's files as radixlm loads them: BOS as the vocabulary adds it."""
    write_hf_metadata(open_gguf(gguf_path), tmp_path)
    served = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    for text in _texts(family):
        want = family.original.encode(text).ids
        assert served(text)["input_ids"] == want, text
        assert served.decode(want) == family.original.decode(want, skip_special_tokens=False)


def _meta(family: Family, tmp_path: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(_write_gguf(tmp_path / "vocab.gguf", family))
    return {name: field.contents() for name, field in reader.fields.items()}


@pytest.mark.parametrize("name", ["llama2", "gemma"])
def test_byte_fallback_spells_unknown_characters_in_bytes(name: str, tmp_path: Path) -> None:
    rebuilt = build_tokenizer(read_vocab(_meta(FAMILIES[name](), tmp_path)))
    tokens = rebuilt.encode("☃", add_special_tokens=False).tokens
    assert tokens[-3:] == ["<0xE2>", "<0x98>", "<0x83>"]
    assert rebuilt.decode(rebuilt.encode("a☃").ids) == "a☃"


def test_unknown_pre_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    meta = _meta(FAMILIES["qwen2"](), tmp_path)
    with pytest.raises(ModelLoadError, match=r"'jais-9'.*'llama-bpe'.*'qwen2'"):
        read_vocab({**meta, "tokenizer.ggml.pre": "jais-9"})
    with pytest.raises(ModelLoadError, match=r"'t5'.*\['gpt2', 'llama'\]"):
        read_vocab({**meta, "tokenizer.ggml.model": "t5"})


def test_phi3_chat_tokens_take_the_whitespace_after_them(tmp_path: Path) -> None:
    """Phi-3's tokenizer.json right-strips its chat tokens (llama.cpp does, by name)."""
    meta = _meta(FAMILIES["llama2"](), tmp_path)
    phi3 = build_tokenizer(read_vocab({**meta, "general.architecture": "phi3"}))
    llama = build_tokenizer(read_vocab(meta))
    assert phi3.encode("[INST]  \n hi").ids == phi3.encode("[INST]hi").ids
    assert llama.encode("[INST]  \n hi").ids != llama.encode("[INST]hi").ids
