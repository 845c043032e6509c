"""The measured table of CPU paths: what the packaged file holds, the lookups and their
fallbacks (an AMX CPU, an unmeasured dtype or ISA), and the rules a table must keep."""

from __future__ import annotations

import json
import math

import pytest
import torch

from radixlm.kernels.cpu import native
from radixlm.runtime.executor import cpu_paths
from radixlm.runtime.executor.cpu_paths import (
    AMX,
    KINDS,
    NO_AMX,
    Choice,
    KernelRule,
    PathsTable,
    cpu_kind,
    kernel_rule,
)

AMX_FLAGS = frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16", "amx_int8"})


def entry(decode: bool, extend: bool, few_rows: bool) -> dict:
    """A table row with these verdicts (and nothing else: what the loader needs)."""
    verdicts = dict(zip(KINDS, (decode, extend, few_rows), strict=True))
    return {"kinds": {kind: {"kernel_is_faster": v} for kind, v in verdicts.items()}}


# float32 rows say kernel everywhere, bfloat16 rows torch everywhere, avx512 only
TABLE = PathsTable(
    {
        NO_AMX: {
            "avx512": {
                "float32": entry(True, True, True),
                "bfloat16": entry(False, True, False),
            },
            "avx2": {"float32": entry(True, False, True)},
        }
    }
)


def test_the_packaged_table_holds_both_builds_and_dtypes_measured_on_epyc() -> None:
    """Every kind of both builds and dtypes but the avx2 build's bfloat16 extend
    attention: torch's bfloat16 products held to AVX2 take minutes a prefill."""
    rows = cpu_paths.packaged_table().rows[NO_AMX]
    for isa in ("avx2", "avx512"):
        for dtype in ("float32", "bfloat16"):
            row = rows[isa][dtype]
            assert row["cpu"]["label"] == "EPYC-512" and row["cpu"]["amx"] is False
            assert "avx512_bf16" in row["cpu"]["flags"]
            assert row["command"].startswith("benchmarks/bench_cpu_paths.py")
            assert "--write-table" in row["command"] and row["date"].startswith("2026-12-")
            partial = (isa, dtype) == ("avx2", "bfloat16")
            expected = set(KINDS) - {"extend_attention"} if partial else set(KINDS)
            assert set(row["kinds"]) == expected


# the passes that decide each kind (the others listed refine where it stops)
DECIDING = {"decode1", "decode8", "decode32", "prefill1000", "extend512"}


def test_each_packaged_verdict_is_the_geometric_mean_of_its_passes_ratios() -> None:
    for isas in cpu_paths.packaged_table().rows.values():
        for dtypes in isas.values():
            for row in dtypes.values():
                measured = [row, *row.get("models", {}).values()]
                for verdict in (v for m in measured for v in m["kinds"].values()):
                    passes = verdict["passes"]
                    assert all(p["torch_ms"] > 0 and p["kernel_ms"] > 0 for p in passes.values())
                    logs = [math.log(p["ratio"]) for k, p in passes.items() if k in DECIDING]
                    mean = math.exp(sum(logs) / len(logs))
                    assert verdict["ratio"] == pytest.approx(mean)
                    assert verdict["kernel_is_faster"] is (mean > 1.0)


def test_the_decode_passes_of_32_rows_at_bfloat16_are_in_the_table() -> None:
    """The row issue 51 cites: a bfloat16 decode step of 32 requests."""
    for isa in ("avx2", "avx512"):
        kinds = cpu_paths.packaged_table().rows[NO_AMX][isa]["bfloat16"]["kinds"]
        for kind in ("decode_attention", "few_row_layers"):
            assert kinds[kind]["passes"]["decode32"]["kernel_ms"] > 0


def test_a_lookup_reads_its_cpu_kinds_row_per_dtype() -> None:
    assert TABLE.lookup(NO_AMX, "avx512", "float32", "few_row_layers") == Choice(True)
    assert TABLE.lookup(NO_AMX, "avx512", "bfloat16", "few_row_layers") == Choice(False)
    assert TABLE.lookup(NO_AMX, "avx512", "bfloat16", "extend_attention") == Choice(True)
    assert TABLE.lookup(NO_AMX, "avx2", "float32", "extend_attention") == Choice(False)


def test_an_amx_cpu_takes_the_rows_without_amx_until_measured() -> None:
    why = "no AMX CPU measured: the avx512 bfloat16 rows without AMX"
    assert TABLE.lookup(AMX, "avx512", "bfloat16", "extend_attention") == Choice(True, why)
    with_amx = PathsTable({**TABLE.rows, AMX: {"avx512": {"bfloat16": entry(True, True, True)}}})
    assert with_amx.lookup(AMX, "avx512", "bfloat16", "few_row_layers") == Choice(True)
    assert with_amx.lookup(NO_AMX, "avx512", "bfloat16", "few_row_layers") == Choice(False)


def test_an_unmeasured_dtype_or_isa_takes_the_torch_path() -> None:
    float16 = TABLE.lookup(NO_AMX, "avx512", "float16", "decode_attention")
    assert float16 == Choice(False, "float16 not measured with the avx512 build, so the torch path")
    assert PathsTable({}).lookup(NO_AMX, "avx512", "float32", "few_row_layers").fallback
    assert PathsTable({}).lookup(AMX, "avx2", "bfloat16", "decode_attention") == Choice(
        False, "bfloat16 not measured with the avx2 build, so the torch path"
    )


def test_unmeasured_bfloat16_takes_the_float32_verdict_of_its_build() -> None:
    why = "bfloat16 not measured with the avx2 build: its float32 verdict"
    float32 = TABLE.lookup(NO_AMX, "avx2", "float32", "extend_attention").kernel_is_faster
    assert TABLE.lookup(AMX, "avx2", "bfloat16", "extend_attention") == Choice(float32, why)
    float32 = TABLE.lookup(NO_AMX, "avx2", "float32", "decode_attention").kernel_is_faster
    assert TABLE.lookup(NO_AMX, "avx2", "bfloat16", "decode_attention") == Choice(float32, why)


def test_a_row_of_some_kinds_leaves_the_others_to_the_fallback() -> None:
    decode_only = {"kinds": {"decode_attention": {"kernel_is_faster": True}}}
    table = PathsTable.from_json(json.dumps({"cpus": {NO_AMX: {"avx2": {"float32": decode_only}}}}))
    assert table.lookup(NO_AMX, "avx2", "float32", "decode_attention") == Choice(True)
    extend = table.lookup(NO_AMX, "avx2", "float32", "extend_attention")
    assert extend == Choice(False, "float32 not measured with the avx2 build, so the torch path")
    assert kernel_rule("avx2", "float32", table, NO_AMX).notes == (
        "extend_attention, few_row_layers: float32 not measured with the avx2 build, "
        "so the torch path",
    )


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="pass kind 'prefill'"):
        TABLE.lookup(NO_AMX, "avx512", "float32", "prefill")


def _not_a_bool() -> dict:
    row = entry(True, True, True)
    row["kinds"]["few_row_layers"]["kernel_is_faster"] = "yes"
    return {"cpus": {NO_AMX: {"avx2": {"float32": row}}}}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([], "expected an object with 'cpus'"),
        ({"cpus": {"sapphire": {}}}, "CPU kind 'sapphire'"),
        ({"cpus": {NO_AMX: {"avx2": {"float32": {"kinds": {}}}}}}, "no_amx/avx2/float32 needs"),
        (
            {
                "cpus": {
                    NO_AMX: {
                        "avx2": {"float32": {"kinds": {"lm_head": {"kernel_is_faster": True}}}}
                    }
                }
            },
            "avx2/float32 needs",
        ),
        (_not_a_bool(), "needs a boolean kernel_is_faster"),
    ],
)
def test_a_malformed_table_is_refused(table, message) -> None:
    with pytest.raises(ValueError, match=message):
        PathsTable.from_json(json.dumps(table))


def test_the_cpu_kind_is_amx_with_bfloat16_tiles() -> None:
    assert cpu_kind(AMX_FLAGS) == AMX
    assert cpu_kind(frozenset({"avx512f", "amx_tile", "amx_int8"})) == NO_AMX
    assert cpu_kind(frozenset({"avx512f", "avx512_bf16"})) == NO_AMX


def test_the_rule_gathers_every_kind_and_each_fallback_once() -> None:
    assert kernel_rule("avx512", torch.bfloat16, TABLE, NO_AMX) == KernelRule(
        "avx512", "bfloat16", False, True, False
    )
    amx = kernel_rule("avx512", torch.float32, TABLE, AMX)
    assert (amx.decode_attention, amx.extend_attention, amx.few_row_layers) == (True,) * 3
    assert amx.notes == (
        "decode_attention, extend_attention, few_row_layers: "
        "no AMX CPU measured: the avx512 float32 rows without AMX",
    )
    float16 = kernel_rule("avx512", torch.float16, TABLE, NO_AMX)
    assert float16 == KernelRule(
        "avx512",
        "float16",
        False,
        False,
        False,
        (
            "decode_attention, extend_attention, few_row_layers: "
            "float16 not measured with the avx512 build, so the torch path",
        ),
    )


def test_the_lookups_read_the_packaged_table_for_this_cpu(monkeypatch) -> None:
    monkeypatch.setattr(cpu_paths, "packaged_table", lambda: TABLE)
    monkeypatch.setattr(native, "_cpu_flags", lambda: AMX_FLAGS)
    assert cpu_kind() == AMX
    assert cpu_paths.kernel_is_faster("avx512", torch.bfloat16, "extend_attention") is True
    assert cpu_paths.kernel_is_faster("avx512", "bfloat16", "few_row_layers") is False
    assert kernel_rule("avx512", "float32").notes == (
        "decode_attention, extend_attention, few_row_layers: "
        "no AMX CPU measured: the avx512 float32 rows without AMX",
    )


def _passes(**ratios: float) -> dict:
    return {name: {"torch_ms": 1.0, "kernel_ms": 1.0 / r, "ratio": r} for name, r in ratios.items()}


@pytest.mark.parametrize(
    ("ratios", "limit"),
    [
        ({"decode1": 1.43, "decode8": 1.004, "decode32": 0.80}, 8),  # avx512 bfloat16
        ({"decode1": 1.6, "decode8": 1.5, "decode32": 1.27}, None),  # every one faster
        ({"decode1": 0.9, "decode8": 1.2}, None),  # the smallest slower: no limit to say
        ({"decode8": 0.9, "decode1": 1.1, "prefill1000": 0.5}, 1),  # decode passes only
    ],
)
def test_the_few_row_layers_stop_where_a_larger_pass_measured_slower(ratios, limit) -> None:
    row = entry(True, True, True)
    row["kinds"]["few_row_layers"]["passes"] = _passes(**ratios)
    table = PathsTable({NO_AMX: {"avx512": {"bfloat16": row}}})
    assert table.max_rows(NO_AMX, "avx512", "bfloat16", "few_row_layers") == limit
    assert table.max_rows(AMX, "avx512", "bfloat16", "few_row_layers") == limit  # its rows
    rule = kernel_rule("avx512", "bfloat16", table, NO_AMX)
    assert rule.few_row_layers and rule.few_row_layers_max_rows == limit
    assert kernel_rule("avx2", "bfloat16", table, NO_AMX).few_row_layers_max_rows is None


def test_the_few_row_limit_comes_from_the_measured_shape_nearest_the_model() -> None:
    """A row on the default model (hidden 576) and Llama-3.2-1B's shape (2048) measured
    beside it: a model takes the limit of the nearer size by ratio (the geometric
    midpoint is ~1,086); a row without sizes, or a model of unknown size, the row's."""
    row = entry(True, True, True) | {"hidden_size": 576}
    row["kinds"]["few_row_layers"]["passes"] = _passes(decode1=2.1, decode8=1.6, decode64=0.9)
    big = entry(True, True, True) | {"hidden_size": 2048}
    big["kinds"]["few_row_layers"]["passes"] = _passes(decode1=1.5, decode2=1.05, decode4=0.9)
    row["models"] = {"llama-3.2-1b-shape": big}
    text = json.dumps({"cpus": {NO_AMX: {"avx512": {"bfloat16": row}}}})
    table = PathsTable.from_json(text)

    def limit(hidden_size: int | None) -> int | None:
        return table.max_rows(NO_AMX, "avx512", "bfloat16", "few_row_layers", hidden_size)

    assert [limit(h) for h in (576, 1024, 1152, 2048, 4096, None)] == [8, 8, 2, 2, 2, 8]
    assert kernel_rule("avx512", "bfloat16", table, NO_AMX, 3072).few_row_layers_max_rows == 2
    assert kernel_rule("avx512", "bfloat16", table, NO_AMX).few_row_layers_max_rows == 8
    del row["hidden_size"]  # a row measured before sizes were written: its own limit
    unsized = PathsTable({NO_AMX: {"avx512": {"bfloat16": row}}})
    assert unsized.max_rows(NO_AMX, "avx512", "bfloat16", "few_row_layers", 2048) == 8
    row["models"]["bad"] = {"hidden_size": 4096, "kinds": {}}
    with pytest.raises(ValueError, match="models/bad needs a boolean kernel_is_faster"):
        PathsTable.from_json(json.dumps({"cpus": {NO_AMX: {"avx512": {"bfloat16": row}}}}))
