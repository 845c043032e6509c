"""bench_serving.py's parts: what a load generator needs, each piece small and testable.

    datasets   the requests (prompt token ids, forced output lengths), from a seed
    arrivals   when each request is sent (Poisson with a seed, or all at once)
    sse        server-sent events, line by line, into JSON payloads
    metrics    per-request results -> throughput, latency percentiles, goodput
    clients    an OpenAI-compatible HTTP server (or its /generate), or radixlm's Engine
    prefix_cache  the prompt tokens a side found cached, from the servers' counters
    launch     a server started on a free loopback port, stopped afterwards
    runner     a workload sent through a client under a rate / concurrency limit
    report     the table printed and the PNG of a rate sweep
    machine    how many cores other processes kept busy during a run (/proc)

Only ``clients``, ``launch`` and ``report`` import third-party packages (httpx,
radixlm, matplotlib), lazily; the rest is the standard library.
"""
