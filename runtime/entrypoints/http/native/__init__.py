"""SGLang's native routes (``/generate``, ``/abort_request``, ``/flush_cache``, server and
model info, health, tokenize, ``/metrics``)."""
