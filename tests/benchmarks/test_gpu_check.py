"""benchmarks/gpu_check.py's dry run, as the GPU machine would run it: radixlm from
the source tree (not the installed package) and none of the packages that machine
lacks (the grammar backends, the server's, gguf, jinja2)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

# radixlm's dependencies a bare GPU machine (torch, triton, transformers, safetensors,
# numpy) does not have.
ABSENT = (
    "gguf",
    "jinja2",
    "outlines_core",
    "xgrammar",
    "llguidance",
    "interegular",
    "jsonschema",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "prometheus_client",
    "httpx",
)


def _site_without(tmp_path: Path, absent: tuple[str, ...]) -> Path:
    """A copy of this venv's site-packages (symlinks) without ``absent`` and without
    the editable install of radixlm: what the bare GPU machine has."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    mirror = tmp_path / "site-packages"
    mirror.mkdir()
    for entry in site.iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top in absent or "radixlm" in entry.name.lower() or entry.suffix == ".pth":
            continue
        (mirror / entry.name).symlink_to(entry)
    return mirror


def test_the_dry_run_runs_every_section_without_the_optional_packages(tmp_path) -> None:
    out = tmp_path / "gpu_check.json"
    site = _site_without(tmp_path, ABSENT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(site)}
    script = str(ROOT / "benchmarks" / "gpu_check.py")
    proc = subprocess.run(
        # -S: no site-packages but the mirror on PYTHONPATH
        # no carried wheels: the sections needing the absent packages say so
        [sys.executable, "-S", script, "--dry-run", "--out", str(out), "--carry", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["machine"]["device"] == "cpu"
    rows = {r["name"]: r for r in result["rows"]}
    kernels = [r for r in result["rows"] if r["section"] == "kernels"]
    assert len(kernels) == 5 and all(r["passed"] for r in kernels), kernels
    for name in (
        "masked sampling, 4 rows x 300 tokens",
        "decode batch 3: triton / torch",
        "prefill 24: triton / torch",
        "CUDA graphs: step time off / on",
        "few-shot: no cache / cache",
    ):
        assert rows[name]["value"] > 0 and rows[name]["passed"] is None, name  # no verdicts
    # on a CPU both sides of each comparison run the same kernels on the same shapes
    assert rows["greedy tokens, CUDA graphs on = off"]["value"] == 1
    assert rows["greedy tokens, CUDA graphs on = off"]["passed"] is True
    assert 0 <= rows["greedy tokens, triton = torch"]["value"] <= 1
    assert rows["decode batch 3: n-gram speculation / none"]["value"] > 0
    assert 0 <= rows["n-gram speculation: acceptance rate"]["value"] <= 1
    assert 0 <= rows["greedy tokens, n-gram speculation = none"]["value"] <= 1
    assert rows["greedy tokens, overlap on = off"]["value"] == 1  # the same passes' tokens
    assert rows["decode b3: overlap on / off"]["value"] > 0
    placements = result["placements"]
    assert placements["triton"] == {
        "device": "cpu",
        "attention_backend": "triton",
        "cuda_graph_batch_sizes": [],
        "weights": placements["torch"]["weights"],  # the dtype gpu_check asks for
        "weight_bytes": placements["torch"]["weight_bytes"],
        "tp_size": 1,
        "overlap_schedule": True,  # the GPU's default, asked for by name
        "grammar_mask_threads": 1,  # "auto": 1 on a CPU
        "kv_format": placements["torch"]["kv_format"],  # the model's dtype
        "kv_bytes_per_token": placements["torch"]["kv_bytes_per_token"],
    }
    assert placements["triton"]["weight_bytes"] > 0
    assert placements["no_overlap"]["overlap_schedule"] is False
    assert placements["torch"]["attention_backend"] == "torch"
    assert proc.stdout.splitlines()[0].split()[:2] == ["section", "check"]
    for name in (  # issue 47
        "masked sampling, greedy rows, 4 rows x 300 tokens",
        "decode attention B=1 x 16 tokens, H=4/2 D=16 / KV-read floor",
        "1B shape: decode step b1 / floor",
        "8B shape (2 of 32 layers): decode step b1 / floor",
        "decode batch 3: triton / transformers static cache",
    ):
        assert rows[name]["value"] > 0 and rows[name]["passed"] is None, name
    assert {r["section"] for r in result["rows"]} >= {"ceilings", "floors", "traffic"}
    for section in ("constrained", "serving"):  # outlines_core, fastapi, ... are absent
        skipped = [r for r in result["rows"] if r["section"] == section]
        assert len(skipped) == 1 and "no wheels in" in skipped[0]["name"], skipped


def test_an_engine_that_fails_is_a_row_and_the_others_still_count(monkeypatch, capsys) -> None:
    """A GPU run is scarce: one configuration raising (here the torch backend's)
    becomes a failed row with its error, the comparisons without it still come."""
    sizes = gpu_check.DRY

    @contextlib.contextmanager
    def fake_engine(model_dir, sizes, **options):
        if options.get("attention_backend") == "torch":
            raise RuntimeError("CUDA out of memory\nmore detail")
        yield options

    def fake_measure(options, sizes, what):
        graphs_off = options.get("disable_cuda_graph", False)
        return gpu_check.EngineFigures(
            step_s_batch1=0.004 if graphs_off else 0.002,
            fewshot_s=2.0 if options.get("disable_radix_cache") else 0.5,
            tokens=[[1, 2, 3], [4, 5, 6]] if not graphs_off else [[1, 2, 3], [4, 9, 9]],
            placement={"attention_backend": options["attention_backend"]},
            decode_tok_s={1: 30.0 if options.get("speculative") else 20.0},
            acceptance_rate=0.75 if options.get("speculative") else None,
        )

    monkeypatch.setattr(gpu_check, "engine", fake_engine)
    monkeypatch.setattr(gpu_check, "measure", fake_measure)
    rows, placements = gpu_check.engine_rows(Path("unused"), sizes)
    by_name = {r.name: r for r in rows}
    failed = by_name["engine 'torch' failed: RuntimeError: CUDA out of memory"]
    assert failed.passed is False and failed.target == "runs"
    assert "CUDA out of memory" in capsys.readouterr().err  # the traceback
    graphs = by_name["greedy tokens, CUDA graphs on = off"]
    assert graphs.value == 4 / 6 and graphs.passed is False  # row 2 differs from token 2 on
    assert by_name["few-shot: no cache / cache"].value == 4.0
    assert not any("triton / torch" in name or "torch backend" in name for name in by_name)
    assert set(placements) == {"triton", "no_graphs", "no_cache", "speculative", "no_overlap"}
    assert by_name["decode b1: overlap on / off"].value == 1.0
    speculation = by_name["decode batch 1: n-gram speculation / none"]
    assert speculation.value == 1.5 and speculation.target == ">= 1.0"
    assert by_name["n-gram speculation: acceptance rate"].value == 0.75
    assert by_name["greedy tokens, n-gram speculation = none"].value == 1


def test_past_its_time_budget_the_run_writes_what_it_has_and_stops(tmp_path) -> None:
    out = tmp_path / "gpu_check.json"
    script = str(ROOT / "benchmarks" / "gpu_check.py")
    proc = subprocess.run(
        [sys.executable, script, "--dry-run", "--out", str(out), "--budget-s", "6"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 124, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["timed_out"] is True and result["seconds"] >= 6
    assert "stopped at the time budget" in proc.stdout
    assert len(result["engine_figures"]) < len(gpu_check.ENGINES)  # stopped part-way


def test_missing_modules_are_installed_from_the_carried_wheels(tmp_path, monkeypatch) -> None:
    """The GPU machine has no network: a module that does not import is installed from
    carry/wheels (pip --no-index --target into the scratch directory) and put on the path;
    without wheels the section is skipped with the reason."""
    module = "radixlm_gpu_check_fake_module"
    scratch, carry = tmp_path / "scratch", tmp_path / "carry"
    scratch.mkdir()
    reason = gpu_check.carried_packages((module,), carry, scratch)
    assert reason and "no radixlm_gpu_check_fake_module and no wheels in" in reason
    (carry / "wheels").mkdir(parents=True)
    (carry / "wheels" / "fake-1.0-py3-none-any.whl").write_text("")
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        target = Path(cmd[cmd.index("--target") + 1])
        target.mkdir()
        (target / f"{module}.py").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_pip)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    assert gpu_check.carried_packages((module,), carry, scratch) is None
    (cmd,) = calls
    assert (
        "--no-index" in cmd and "--no-deps" in cmd and cmd[-1].endswith("fake-1.0-py3-none-any.whl")
    )
    assert sys.path[0] == str(scratch / "site") == os.environ["PYTHONPATH"]
    assert gpu_check.carried_packages((module, "not_carried_either"), carry, scratch) == (
        "no not_carried_either among the carried wheels"
    )


def test_constrained_and_serving_sections_run_on_the_bpe_model(tmp_path) -> None:
    """The two sections the dry-run test skips (their packages are absent there), here
    with this venv's: the default model's tokenizer on the tiny model, a regex constraint,
    and bench_serving's engine and HTTP sides."""
    from radixlm.runtime.model_store import default_model_dir

    sizes = gpu_check.DRY
    source = gpu_check.tokenizer_source(tmp_path / "no-carry")
    assert source == default_model_dir()
    model_dir = gpu_check.write_bpe_model(tmp_path, sizes, source)
    rows = {r.name: r for r in gpu_check.constrained_rows(model_dir, sizes)}
    ratio = rows["decode batch 3: constrained / unconstrained"]
    assert ratio.value > 0 and ratio.target == ">= 0.9" and ratio.passed is None
    rows = {r.name: r for r in gpu_check.serving_rows(model_dir, sizes, tmp_path)}
    assert rows["HTTP / in-process output tok/s"].value > 0
    assert rows["median TPOT, HTTP"].value >= 0
