"""bench_cpu_paths.py's table: each kind's verdict from the passes that decide it, and
the writer, which merges a run's rows into the file under the CPU's kind, keeping the
rows it did not measure (an AMX machine's run adds its own beside the others)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from radixlm.kernels.cpu import native
from radixlm.runtime.executor.cpu_paths import AMX, KINDS, NO_AMX, PathsTable

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_cpu_paths as bench  # noqa: E402


def _passes(torch_ms: float, attention_ms: dict[str, float], all_ms: float) -> dict:
    """Measured medians of the passes ``attention_ms`` names: the torch side
    ``torch_ms``, the attention side ``attention_ms[key]``, the all side ``all_ms``."""
    passes = {}
    for key in attention_ms:
        median = {"torch": torch_ms, "attention": attention_ms[key], "all": all_ms}
        passes[key] = {"median_ms": median, "runs_ms": {s: [ms] for s, ms in median.items()}}
    return passes


def test_a_pass_ratio_is_the_median_of_the_paired_ratios() -> None:
    """A slow spell that hits both sides of a repeat moves neither ratio."""
    assert bench.paired_ratio([100.0, 1000.0, 90.0], [50.0, 500.0, 100.0]) == 2.0
    assert bench.paired_ratio([100.0, 400.0], [100.0, 100.0]) == 2.5


def test_a_kinds_verdict_is_the_geometric_mean_of_its_passes() -> None:
    attention = {"decode1": 50.0, "decode8": 200.0, "decode32": 100.0}
    attention |= {"prefill1000": 50.0, "extend512": 125.0}
    verdicts = bench.kind_verdicts(_passes(100.0, attention, 100.0))
    decode = verdicts["decode_attention"]
    assert decode["passes"]["decode8"] == {"torch_ms": 100.0, "kernel_ms": 200.0, "ratio": 0.5}
    assert decode["ratio"] == pytest.approx((2.0 * 0.5 * 1.0) ** (1 / 3))
    assert decode["kernel_is_faster"] is False  # a mean of exactly 1 is not faster
    extend = verdicts["extend_attention"]
    assert set(extend["passes"]) == {"prefill1000", "extend512"}
    assert extend["ratio"] == pytest.approx((2.0 * 0.8) ** 0.5)
    assert extend["kernel_is_faster"] is True
    few_rows = verdicts["few_row_layers"]  # "all" against "attention", decode passes
    assert few_rows["passes"]["decode1"] == {"torch_ms": 50.0, "kernel_ms": 100.0, "ratio": 0.5}
    assert few_rows["ratio"] == pytest.approx((0.5 * 2.0 * 1.0) ** (1 / 3))
    assert set(verdicts) == set(KINDS)


def test_a_run_of_some_passes_decides_the_kinds_they_cover() -> None:
    decode = {"decode1", "decode8", "decode32"}
    assert bench.decided_kinds(decode) == ["decode_attention", "few_row_layers"]
    assert bench.decided_kinds({"decode1", "decode8", "prefill1000"}) == []
    assert bench.decided_kinds(set(bench.PASSES)) == list(KINDS)
    measured = _passes(100.0, dict.fromkeys(bench.PASSES, 80.0), 50.0)
    verdicts = bench.kind_verdicts({k: v for k, v in measured.items() if k in decode})
    assert set(verdicts) == {"decode_attention", "few_row_layers"}
    assert verdicts["decode_attention"]["ratio"] == pytest.approx(1.25)
    assert verdicts["few_row_layers"]["ratio"] == pytest.approx(1.6)


def _entry(label: str, faster: bool) -> dict:
    kinds = {kind: {"kernel_is_faster": faster, "ratio": 1.0, "passes": {}} for kind in KINDS}
    return bench.table_entry(kinds, {"label": label}, {"date": "2026-12-05", "command": "x"})


def test_a_row_is_the_cpu_the_run_and_the_verdicts() -> None:
    row = _entry("EPYC-512", True)
    assert row["cpu"] == {"label": "EPYC-512"}
    assert (row["date"], row["command"]) == ("2026-12-05", "x")
    assert set(row["kinds"]) == set(KINDS)


def test_the_merge_replaces_only_the_rows_measured() -> None:
    table = bench.merge_table({}, NO_AMX, "avx512", "float32", _entry("EPYC-512", True))
    table = bench.merge_table(table, NO_AMX, "avx512", "bfloat16", _entry("EPYC-512", False))
    table = bench.merge_table(table, NO_AMX, "avx2", "float32", _entry("EPYC-512", True))
    merged = bench.merge_table(table, NO_AMX, "avx512", "bfloat16", _entry("EPYC-9", True))
    assert merged["cpus"][NO_AMX]["avx512"]["bfloat16"]["cpu"]["label"] == "EPYC-9"
    assert merged["cpus"][NO_AMX]["avx512"]["float32"] == table["cpus"][NO_AMX]["avx512"]["float32"]
    assert merged["cpus"][NO_AMX]["avx2"] == table["cpus"][NO_AMX]["avx2"]
    assert table["cpus"][NO_AMX]["avx512"]["bfloat16"]["cpu"]["label"] == "EPYC-512"  # a copy
    assert merged["about"] == bench.TABLE_ABOUT


def test_an_amx_run_adds_its_rows_beside_the_others(tmp_path) -> None:
    path = tmp_path / "table.json"
    epyc = {(isa, d): _entry("EPYC-512", True) for isa in ("avx2", "avx512") for d in bench.DTYPES}
    bench.write_table(path, NO_AMX, epyc)
    bench.write_table(path, AMX, {("avx512", "bfloat16"): _entry("Xeon-AMX", False)})
    table = json.loads(path.read_text())
    assert set(table["cpus"]) == {NO_AMX, AMX}
    assert table["cpus"][NO_AMX] == {
        isa: {d: epyc[isa, d] for d in bench.DTYPES} for isa in ("avx2", "avx512")
    }
    assert table["cpus"][AMX] == {"avx512": {"bfloat16": _entry("Xeon-AMX", False)}}
    loaded = PathsTable.from_json(path.read_text())
    assert loaded.lookup(AMX, "avx512", "bfloat16", "few_row_layers").kernel_is_faster is False
    assert loaded.lookup(NO_AMX, "avx512", "bfloat16", "few_row_layers").kernel_is_faster is True


def test_a_table_the_engine_could_not_read_is_not_written(tmp_path) -> None:
    path = tmp_path / "table.json"
    with pytest.raises(ValueError, match="kernel_is_faster"):
        bench.write_table(path, NO_AMX, {("avx2", "float32"): {"cpu": {}, "kinds": {}}})
    assert not path.exists()


def test_the_cpu_is_described_by_its_vector_flags_and_amx(monkeypatch) -> None:
    flags = frozenset({"sse4_2", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    monkeypatch.setattr(native, "_cpu_flags", lambda: flags)
    cpu = bench.describe_cpu("Xeon-AMX")
    assert cpu["label"] == "Xeon-AMX" and cpu["amx"] is True
    assert cpu["flags"] == ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f", "fma"]
    monkeypatch.setattr(native, "_cpu_flags", lambda: flags - {"amx_bf16"})
    assert bench.describe_cpu(None)["amx"] is False


def test_the_children_take_every_kernel_whatever_the_packaged_table_says() -> None:
    table = bench.all_kernels_table()
    for cpu in (AMX, NO_AMX):
        for target in native.runnable_targets():
            for dtype in bench.DTYPES:
                for kind in KINDS:
                    choice = table.lookup(cpu, target.name, dtype, kind)
                    assert choice.kernel_is_faster is True and choice.fallback is None


def test_more_decode_passes_refine_the_limit_not_the_verdict() -> None:
    """decode2/4/16 are listed with the few-row layers' passes (where they stop), but
    the geometric mean stays over the deciding decode1/8/32."""
    measured = _passes(100.0, dict.fromkeys(bench.PASSES, 80.0), 50.0)
    measured["decode4"]["median_ms"]["all"] = 200.0
    measured["decode4"]["runs_ms"]["all"] = [200.0]
    verdicts = bench.kind_verdicts(measured)
    few_rows = verdicts["few_row_layers"]
    assert list(few_rows["passes"]) == [f"decode{n}" for n in (1, 2, 4, 8, 16, 32)]
    assert few_rows["passes"]["decode4"]["ratio"] == pytest.approx(0.4)
    assert few_rows["ratio"] == pytest.approx(1.6)  # decode1, 8, 32 only
    assert set(verdicts["extend_attention"]["passes"]) == {"prefill1000", "extend512"}
    assert set(bench.DEFAULT_PASSES) == {"decode1", "decode8", "decode32"} | {
        "prefill1000",
        "extend512",
    }


def test_another_model_is_measured_beside_the_row(tmp_path) -> None:
    """A run on another shape goes under the row's ``models`` (the row must exist); a
    later run of the row keeps what was measured beside it."""
    path = tmp_path / "table.json"
    with pytest.raises(ValueError, match="no row to measure big beside"):
        bench.write_table(path, NO_AMX, {("avx512", "bfloat16"): _entry("EPYC-512", True)}, "big")
    bench.write_table(path, NO_AMX, {("avx512", "bfloat16"): _entry("EPYC-512", True)})
    bench.write_table(path, NO_AMX, {("avx512", "bfloat16"): _entry("EPYC-512", False)}, "big")
    row = json.loads(path.read_text())["cpus"][NO_AMX]["avx512"]["bfloat16"]
    assert row["kinds"] == _entry("EPYC-512", True)["kinds"]
    assert row["models"] == {"big": _entry("EPYC-512", False)}
    bench.write_table(path, NO_AMX, {("avx512", "bfloat16"): _entry("EPYC-9", True)})
    row = json.loads(path.read_text())["cpus"][NO_AMX]["avx512"]["bfloat16"]
    assert row["cpu"]["label"] == "EPYC-9" and row["models"] == {"big": _entry("EPYC-512", False)}
