"""radixlm's serving runtime, one subpackage per component:

- ``entrypoints``: the offline ``Engine``, its loop, the runtime's assembly, the CLI
- ``speculative``, ``distributed``: speculative decoding; tensor parallelism
- ``io``: sampling params, request building (validation), detokenization
- ``scheduling``: request state and the continuous-batching scheduler
- ``mem_cache``: KV pool, slot allocator, ``req_to_token``, radix cache
- ``executor``: the model runner and its forward paths
- ``attention``: attention backends over the KV pool
- ``layers``, ``models``: the Llama-family decoders in plain torch and their loader
- ``sampling``: the sampler; ``constrained``: grammars as token masks
- ``model_store``: where models live, the default model's pull
- ``config``, ``errors``: the engine's config dataclasses and error types

Importing this package imports nothing else. The packages form layers without import
cycles (docs/architecture.md, "Packages in layers"; tests/test_layers.py checks them).
"""
