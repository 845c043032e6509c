"""bench_schema_coverage.py's pure parts: the sample, the prompt, refusal parsing, the
output check, the aggregation and the table; and the shipped real-world sample.
No model, no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from schema_coverage.dataset import (  # noqa: E402
    SchemaFile,
    data_folder,
    is_maskbench,
    list_schema_files,
    sample_schemas,
    schema_prompt,
)
from schema_coverage.outcomes import (  # noqa: E402
    SchemaOutcome,
    classify_output,
    output_violation,
    refusal_pointers,
    refused_names,
    unchecked_formats,
)
from schema_coverage.summary import (  # noqa: E402
    format_table,
    paper_comparison,
    refusal_counts,
    summarize,
)

SHIPPED = Path(__file__).parents[1] / "data" / "jsonschemabench"
DRAFT4 = "http://json-schema.org/draft-04/schema#"


# ---- the sample ------------------------------------------------------------------------


def fake_data(root: Path, sizes: dict[str, int]) -> Path:
    for dataset, n in sizes.items():
        (root / dataset).mkdir(parents=True)
        for i in range(n):
            (root / dataset / f"s{i:03d}.json").write_text('{"type": "object"}')
    (root / "README.md").write_text("not a dataset")
    return root


def test_list_schema_files_sorted_per_dataset(tmp_path):
    data = fake_data(tmp_path, {"B": 3, "A": 2})
    (data / "A" / "notes.txt").write_text("not a schema")
    assert list_schema_files(data) == {"A": ["s000.json", "s001.json"],
                                       "B": ["s000.json", "s001.json", "s002.json"]}  # fmt: skip
    assert list(list_schema_files(data, ["B"])) == ["B"]
    with pytest.raises(ValueError, match="no dataset folder"):
        list_schema_files(data, ["C"])
    with pytest.raises(ValueError, match="holds no dataset folders"):
        list_schema_files(tmp_path / "missing")


def test_maskbench_layout_groups_by_dataset_and_unwraps(tmp_path):
    wrapped = {"schema": {"type": "integer"}, "tests": [], "meta": {}}
    for name in ("Github_easy---o1.json", "Github_easy---o0.json", "BFCL_java_10.json",
                 "BFCL_java_2.json", "JME_0.json"):  # fmt: skip
        (tmp_path / name).write_text(json.dumps(wrapped))
    (tmp_path / "README.md").write_text("not a schema")
    assert is_maskbench(tmp_path) and not is_maskbench(fake_data(tmp_path / "jsb", {"A": 1}))
    files = list_schema_files(tmp_path)
    assert files == {"BFCL_java": ["BFCL_java_10.json", "BFCL_java_2.json"],
                     "Github_easy": ["Github_easy---o0.json", "Github_easy---o1.json"],
                     "JME": ["JME_0.json"]}  # fmt: skip
    sample = sample_schemas(files, 1, seed=4, wrapped=True)
    assert [(s.dataset, s.wrapped) for s in sample] == [
        ("BFCL_java", True), ("Github_easy", True), ("JME", True),
    ]  # fmt: skip
    assert sample[2].path(tmp_path) == tmp_path / "JME_0.json"
    assert sample[2].load(tmp_path) == {"type": "integer"}
    (tmp_path / "JME_1.json").write_text('{"type": "object"}')  # a bare schema: no wrapper
    with pytest.raises(ValueError, match="MaskBench file holds"):
        SchemaFile("JME", "JME_1.json", wrapped=True).load(tmp_path)


def test_data_folder_from_the_cache_or_a_clear_error(tmp_path):
    (tmp_path / "maskbench" / "data").mkdir(parents=True)
    assert data_folder("maskbench", tmp_path, fetch=False) == tmp_path / "maskbench" / "data"
    with pytest.raises(ValueError, match="give --data DIR .* or --fetch"):
        data_folder("jsonschemabench", tmp_path, fetch=False)
    with pytest.raises(ValueError, match="unknown source 'mask'"):
        data_folder("mask", tmp_path, fetch=True)


def test_sample_reproducible_and_seeded():
    files = {"A": [f"a{i}.json" for i in range(50)], "B": [f"b{i}.json" for i in range(50)]}
    first = sample_schemas(files, 5, seed=0)
    assert first == sample_schemas(files, 5, seed=0)
    assert first == sample_schemas({k: v[::-1] for k, v in files.items()}, 5, seed=0)
    assert first != sample_schemas(files, 5, seed=1)
    assert [s.dataset for s in first] == ["A"] * 5 + ["B"] * 5
    names = [s.name for s in first if s.dataset == "A"]
    assert names == sorted(names) and len(set(names)) == 5


def test_sample_of_a_dataset_ignores_the_others():
    a = [f"a{i}.json" for i in range(40)]
    alone = sample_schemas({"A": a}, 4, seed=3)
    together = sample_schemas({"A": a, "Z": ["z.json"]}, 4, seed=3)
    assert [s for s in together if s.dataset == "A"] == alone


def test_sample_takes_all_of_a_small_dataset_and_rejects_zero():
    assert sample_schemas({"A": ["x.json", "y.json"]}, 25, 0) == [
        SchemaFile("A", "x.json"), SchemaFile("A", "y.json"),
    ]  # fmt: skip
    with pytest.raises(ValueError):
        sample_schemas({"A": ["x.json"]}, 0, 0)


def test_schema_prompt_compact_and_truncated():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    prompt = schema_prompt(schema, 1000)
    assert prompt.endswith('{"type":"object","properties":{"name":{"type":"string"}}}')
    short = schema_prompt(schema, 10)
    assert short.endswith('{"type":"o ... (schema truncated)')
    assert short.split("JSON Schema:")[0] == prompt.split("JSON Schema:")[0]  # shared prefix


# ---- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message, names",
    [
        ("sampling parameter 'json_schema': keyword(s) oneOf at #/properties/a are not "
         "enforced by the xgrammar backend; remove them", ("oneOf",)),
        ("sampling parameter 'json_schema': keyword(s) maximum, minimum at #/definitions/x "
         "are not enforced by the outlines backend (the xgrammar backend enforces them: "
         "grammar_backend='xgrammar'); remove them", ("maximum", "minimum")),
        ("sampling parameter 'json_schema': format 'int32' at #/properties/port is not "
         "enforced by the xgrammar backend (enforced: date, email)", ("format:int32",)),
        ("sampling parameter 'json_schema': pattern and minLength/maxLength together at "
         "#/properties/id: the xgrammar backend enforces only one",
         ("pattern+minLength/maxLength",)),
        ("sampling parameter 'json_schema': compiling it with the outlines backend took over "
         "10 s (grammar_compile_timeout)", ("compile-timeout",)),
        ("sampling parameter 'json_schema': not a valid JSON Schema at properties: 3 is not "
         "of type 'object'", ("invalid-schema",)),
        ("sampling parameter 'json_schema': nested deeper than 24 levels at #/a", ("too-deep",)),
        ("sampling parameter 'json_schema': the schema accepts nothing at #: enum is empty",
         ("accepts-nothing",)),
        ("sampling parameter 'json_schema': xgrammar cannot compile it: bad regex",
         ("backend-error",)),
        ("sampling parameter 'json_schema': a oneOf (of those at #/a) has branches llguidance "
         "cannot prove exclusive (by type, ...)", ("oneOf",)),
        ("sampling parameter 'json_schema': llguidance cannot compile it: circular references "
         "with sibling keys are not supported: #/definitions/Foo",
         ("circular-ref-with-siblings",)),
        ("sampling parameter 'json_schema': llguidance cannot compile it: Schema intersection "
         "stack level exceeded", ("intersection-too-deep",)),
        ("sampling parameter 'json_schema': keyword 'uniqueItems' at #/tags cannot be "
         "enforced", ("uniqueItems",)),
        ("something else entirely", ("other",)),
    ],
)  # fmt: skip
def test_refused_names(message, names):
    assert refused_names(message) == names


@pytest.mark.parametrize(
    "message, pointers",
    [
        ("keyword(s) oneOf at #/properties/a are not enforced", ("#/properties/a",)),
        ("pattern and minLength/maxLength together at #/properties/id: only one",
         ("#/properties/id",)),
        ("format 'int32' at #/properties/port is not enforced; format 'x' at #/b and "
         "again at #/properties/port", ("#/properties/port", "#/b")),
        ("the schema accepts nothing at #: enum is empty", ("#",)),
        ("took over 10 s (grammar_compile_timeout)", ()),
        ("a oneOf (of those at #/a, #/b/oneOf/1) has branches", ("#/a",)),
    ],
)  # fmt: skip
def test_refusal_pointers(message, pointers):
    assert refusal_pointers(message) == pointers


# ---- the output check ------------------------------------------------------------------


def test_output_violation_json_and_schema():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert output_violation(schema, '{"n": 3}') is None
    assert output_violation(schema, '{"n": 3') .startswith("not JSON")  # fmt: skip
    assert "'n' is a required property" in output_violation(schema, "{}")
    assert "is not of type 'integer'" in output_violation(schema, '{"n": "3"}')


def test_output_violation_checks_formats():
    schema = {"type": "string", "format": "email"}
    assert output_violation(schema, '"a@b.org"') is None
    assert "is not a 'email'" in output_violation(schema, '"not an email"')


def test_output_violation_reads_the_schemas_own_draft():
    # draft-04: exclusiveMaximum is a flag on maximum; 2020-12 would reject the schema
    schema = {"$schema": DRAFT4, "type": "number", "maximum": 5, "exclusiveMaximum": True}
    assert output_violation(schema, "4.5") is None
    assert output_violation(schema, "5") is not None


def test_classify_output():
    schema = {"type": "integer"}
    assert classify_output({"type": "length", "length": 8}, "12", schema) == ("length", "")
    assert classify_output({"type": "stop", "matched": 2}, "12", schema) == ("valid", "")
    status, why = classify_output({"type": "stop"}, '"x"', schema)
    assert status == "invalid" and "is not of type 'integer'" in why
    status, why = classify_output({"type": "abort", "message": "boom"}, "", schema)
    assert status == "crash" and "boom" in why


def test_unchecked_formats_only_in_subschemas():
    schema = {
        "properties": {
            "port": {"type": "integer", "format": "int32"},
            "when": {"type": "string", "format": "date-time"},
            "kind": {"enum": [{"format": "in-a-value"}]},
        },
        "self": {"format": "jsonschema"},
        "default": {"format": "in-a-default"},
    }
    unchecked = unchecked_formats(schema)
    assert "int32" in unchecked and "in-a-value" not in unchecked
    assert "jsonschema" not in unchecked and "in-a-default" not in unchecked


def test_outcome_rejects_an_unknown_status():
    with pytest.raises(ValueError, match="status"):
        SchemaOutcome("A", "a.json", "xgrammar", "fine")


# ---- aggregation -----------------------------------------------------------------------


def outcome(dataset: str, status: str, backend: str = "xgrammar", **kw) -> SchemaOutcome:
    compiled = status in ("valid", "invalid", "length")
    kw.setdefault("compile_s", 0.01 if compiled else None)
    return SchemaOutcome(dataset, f"{status}.json", backend, status, compiled=compiled, **kw)


OUTCOMES = [
    outcome("A", "valid", compile_s=0.010, mask_fill_s=(1e-5, 3e-5)),
    outcome("A", "valid", compile_s=0.030, mask_fill_s=(2e-5,)),
    outcome("A", "length", compile_s=0.020),
    outcome("A", "refused", refused=("oneOf",)),
    outcome("B", "refused", refused=("oneOf", "allOf")),
    outcome("B", "invalid", compile_s=0.040, mask_fill_s=(5e-5,)),
    outcome("B", "crash"),
    outcome("B", "valid", backend="other", compile_s=0.5),
]


def test_summarize_counts_shares_and_headline():
    rows = summarize(OUTCOMES)
    assert [(r.backend, r.dataset) for r in rows] == [
        ("xgrammar", "A"), ("xgrammar", "B"), ("other", "B"), ("xgrammar", "all"), ("other", "all"),
    ]  # fmt: skip
    a, b, _, every, _ = rows
    assert (a.num_schemas, a.num_compiled, a.num_valid) == (4, 3, 2)
    assert (a.num_refused, a.num_length, a.num_invalid) == (1, 1, 0)
    assert a.share(a.num_valid) == 0.5 and a.valid_of_finished == pytest.approx(2 / 3)
    assert (b.num_invalid, b.num_crashed, b.num_valid, b.valid_of_finished) == (1, 1, 0, 0.0)
    assert (every.num_schemas, every.num_valid, every.num_invalid) == (7, 2, 1)
    assert a.compile_p50_s == pytest.approx(0.02) and a.compile_p99_s == pytest.approx(0.0298)
    assert a.mask_fill_p50_s == pytest.approx(2e-5) and a.mask_fill_p99_s == pytest.approx(2.98e-5)
    assert b.compile_p50_s == pytest.approx(0.04)  # refusals and crashes have no compile time


def test_summarize_empty_group_has_no_times_and_no_headline():
    (row, _) = summarize([outcome("A", "length"), outcome("A", "length")])
    assert row.valid_of_finished is None and row.mask_fill_p50_s is None


def test_refusal_counts():
    counts = refusal_counts(OUTCOMES)
    assert counts["xgrammar"] == {"oneOf": 2, "allOf": 1} and counts["other"] == {}


def test_format_table_and_paper_line():
    rows = summarize(OUTCOMES)
    table = format_table(rows).splitlines()
    assert table[0].split()[:4] == ["backend", "dataset", "n", "compiled"]
    a = table[2].split()
    assert a[:9] == ["xgrammar", "A", "4", "75%", "50%", "25%", "25%", "0", "0"]
    assert a[9] == "67%" and a[10:13] == ["20.0", "/", "29.8"] and a[13:] == ["20", "/", "30"]
    line = paper_comparison(summarize([outcome("Glaiveai2K", "valid")]), "xgrammar")
    assert "Glaiveai2K 1.00 (1.00) vs 0.94" in line and "Kubernetes" not in line


# ---- the shipped real-world sample -----------------------------------------------------


def test_shipped_sample_is_small_licensed_and_valid():
    files = list_schema_files(SHIPPED)
    assert sorted(files) == ["Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow"]
    assert 25 <= sum(map(len, files.values())) <= 35
    readme = (SHIPPED / "README.md").read_text()
    default = jsonschema.Draft202012Validator
    for dataset, names in files.items():
        assert f"`{dataset}/` | {len(names)} |" in readme
        for name in names:
            path = SHIPPED / dataset / name
            assert path.stat().st_size < 20_000, path
            schema = json.loads(path.read_text())
            jsonschema.validators.validator_for(schema, default=default).check_schema(schema)
    drafts = [json.loads(p.read_text()).get("$schema") for p in SHIPPED.glob("*/*.json")]
    assert drafts.count(DRAFT4) >= 3


def test_multiple_of_is_checked_in_decimal_arithmetic():
    schema = {"type": "number", "multipleOf": 0.01}
    assert output_violation(schema, "19.99") is None  # floats: 1998.9999...
    assert "multiple" in output_violation(schema, "19.995")


def test_without_a_seed_each_run_draws_a_new_sample_and_says_its_seed(monkeypatch, capsys):
    import bench_schema_coverage as bench

    monkeypatch.setattr(sys, "argv", ["bench_schema_coverage.py", "--data", "DATA"])
    seeds = {bench.parse_args().seed for _ in range(4)}
    printed = capsys.readouterr().out.splitlines()
    assert len(seeds) > 1  # 4 draws from 2**31 seeds
    assert printed[0].startswith("sample seed ") and printed[0].endswith(")")
    monkeypatch.setattr(sys, "argv", ["bench_schema_coverage.py", "--data", "DATA", "--seed", "7"])
    assert bench.parse_args().seed == 7
    assert "--seed 7" in capsys.readouterr().out
