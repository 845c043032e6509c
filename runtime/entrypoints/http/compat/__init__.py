"""Compatibility with other servers' clients: the field names vLLM and SGLang define,
accepted on radixlm's routes (honoured, ignored, or refused when they ask for something)."""
