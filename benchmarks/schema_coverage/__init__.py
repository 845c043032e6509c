"""bench_schema_coverage.py's parts: how far real-world JSON schemas get through a backend.

    dataset    JSONSchemaBench's folders -> a reproducible sample, and the prompt per schema
    outcomes   one schema on one backend -> valid / invalid / length / refused / crash,
               with the refused keywords parsed from the error and the output's violation
    summary    outcomes -> per dataset and backend shares, times, the table and the paper's
               coverage beside ours

None imports radixlm: the benchmark runs the engine and hands these plain results;
``outcomes`` needs jsonschema, the rest is the standard library.
"""
