"""radixlm's serving runtime: engine, scheduler, KV pool, model runner, sampler."""
