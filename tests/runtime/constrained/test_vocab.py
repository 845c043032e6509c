from __future__ import annotations


def test_token_bytes_are_raw_bytes_not_decoded_text(vocab, hf_tokenizer):
    space_the = hf_tokenizer.convert_tokens_to_ids("Ġthe")
    assert vocab.token_bytes[space_the] == b" the"
    # Tokens holding part of a UTF-8 character keep their bytes (decode() gives U+FFFD).
    partial = [i for i, b in enumerate(vocab.token_bytes) if b is not None and _not_utf8(b)]
    assert len(partial) > 100
    for i in partial[:50]:
        assert "\ufffd" in hf_tokenizer.decode([i])


def test_every_token_round_trips_through_its_bytes(vocab, hf_tokenizer):
    text = 'naïve café 東京 🙂 {"a": [1, 2]}\n\tend'
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(vocab.token_bytes[i] for i in ids).decode() == text


def test_special_and_eos_tokens_are_excluded(vocab, hf_tokenizer):
    assert vocab.eos_token_ids == frozenset({2})
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"):
        assert vocab.token_bytes[hf_tokenizer.convert_tokens_to_ids(token)] is None
    assert sum(b is None for b in vocab.token_bytes) == 17  # ids 0-16 of SmolLM2


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
        return False
    except UnicodeDecodeError:
        return True
