"""The import graph: ``import radixlm`` and an engine for unconstrained generation
need neither triton nor the grammar packages; ``radixlm.kernels`` imports only torch.

Each check runs in a fresh interpreter whose import system refuses the optional
packages, as a venv without them installed would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

OPTIONAL = ("triton", "outlines_core", "xgrammar", "interegular", "jsonschema")

_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, json, sys
    BLOCKED = {blocked!r}

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
    """
)


def run_blocked(body: str) -> dict:
    """Runs ``body`` with the optional packages refused; it prints one JSON line last."""
    code = _BLOCKER.format(blocked=OPTIONAL) + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_radixlm_and_the_runtime_needs_no_optional_package():
    out = run_blocked(
        """
        import radixlm
        engine_class = radixlm.Engine
        import radixlm.kernels, radixlm.kernels.cpu
        import radixlm.runtime.entrypoints.assembly, radixlm.runtime.constrained
        loaded = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
        print(json.dumps({"engine": engine_class.__name__, "loaded": loaded}))
        """
    )
    assert out == {"engine": "Engine", "loaded": []}


def test_the_triton_kernels_are_where_triton_is_imported():
    out = run_blocked(
        """
        try:
            import radixlm.kernels.triton
            error = None
        except ModuleNotFoundError as e:
            error = e.name
        print(json.dumps({"error": error}))
        """
    )
    assert out == {"error": "triton"}


@pytest.mark.e2e
def test_an_engine_generates_without_the_optional_packages(default_model_dir):
    out = run_blocked(
        f"""
        import radixlm
        from radixlm.runtime.errors import UnsupportedGrammarError
        with radixlm.Engine(model_path={str(default_model_dir)!r}, max_total_tokens=512) as eng:
            result = eng.generate("The capital of France is",
                                  {{"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}})
            try:
                eng.generate("Pick:", {{"regex": "(yes|no)", "max_new_tokens": 4}})
                grammar_error = None
            except UnsupportedGrammarError as e:
                grammar_error = str(e)
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED))
        print(json.dumps({{"num_ids": len(result["output_ids"]), "loaded": loaded,
                           "grammar_error": grammar_error}}))
        """
    )
    assert out["num_ids"] == 4 and out["loaded"] == []
    assert "'outlines' grammar backend needs a package that is not installed" in (
        out["grammar_error"] or ""
    )


def test_imports_go_one_way_from_the_dsl_to_the_runtime_to_the_kernels():
    """runtime/ and kernels/ never import the DSL (radixlm's own top-level modules)."""
    import re
    from pathlib import Path

    root = Path(__file__).parents[1]
    allowed = {"runtime": ("radixlm.runtime", "radixlm.kernels"), "kernels": ("radixlm.kernels",)}
    pattern = re.compile(r"^\s*(?:from|import)\s+(radixlm(?:\.\w+)*)", re.MULTILINE)
    wrong = [
        f"{path.relative_to(root)}: {module}"
        for folder, prefixes in allowed.items()
        for path in (root / folder).rglob("*.py")
        for module in pattern.findall(path.read_text())
        if not module.startswith(prefixes)
    ]
    assert not wrong, wrong
