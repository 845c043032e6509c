"""benchmarks/fetch_gpu_wheels.py's plan, offline: which distributions and versions it
would fetch, and the pip command it would run."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import fetch_gpu_wheels as fetch  # noqa: E402

REQUIRES = {
    "fastapi": ["starlette<2,>=0.40", "pydantic>=2.7", "typing-extensions>=4.8"],
    "starlette": ["anyio<5,>=3.6.2", 'httpx>=0.27; extra == "full"'],
    "pydantic": [
        "pydantic-core==2.50.5",
        "annotated-types>=0.6",
        'tzdata; sys_platform == "win32"',
    ],
    "pydantic-core": ["typing-extensions>=4.14"],
    "annotated-types": [],
    "uvicorn": ["click>=7", "h11>=0.8", 'colorama; sys_platform == "win32"'],
    "h11": [],
}
VERSIONS = {name: f"1.{i}" for i, name in enumerate(sorted(REQUIRES))}


def _plan(needed: tuple[str, ...]) -> list[fetch.Pin]:
    return fetch.plan(
        needed,
        requires=lambda name: REQUIRES[name],
        version=lambda name: VERSIONS[name],
        on_gpu=frozenset({"anyio", "click", "typing-extensions"}),
    )


def test_the_plan_is_the_closure_less_what_the_gpu_has_and_other_platforms_need() -> None:
    pins = _plan(("FastAPI", "uvicorn"))
    names = "annotated-types fastapi h11 pydantic pydantic-core starlette uvicorn".split()
    # no extras (httpx), no Windows-only (tzdata, colorama), nothing the GPU has
    assert [p.spec() for p in pins] == [f"{name}=={VERSIONS[name]}" for name in names]


def test_names_are_normalized_and_each_is_planned_once() -> None:
    assert fetch.normalize("Pydantic_Core") == "pydantic-core"
    pins = _plan(("pydantic", "pydantic_core", "fastapi"))
    names = [p.name for p in pins]
    assert len(names) == len(set(names)) and "pydantic-core" in names


def test_the_real_plan_pins_this_venvs_versions() -> None:
    needed = tuple(n for names in fetch.NEEDED.values() for n in names)
    pins = {p.name: p.version for p in fetch.plan(needed)}
    wanted = {"fastapi", "uvicorn", "pydantic", "pydantic-core", "orjson", "outlines-core"}
    assert wanted <= set(pins)
    assert not set(pins) & fetch.ON_GPU
    import importlib.metadata

    assert pins["pydantic-core"] == importlib.metadata.version("pydantic_core")


def test_the_download_command_asks_for_cp312_manylinux_wheels_only(tmp_path) -> None:
    cmd = fetch.download_command(fetch.Pin("orjson", "3.13.0"), tmp_path)
    assert cmd[-1] == "orjson==3.13.0" and "--no-deps" in cmd
    assert "--only-binary=:all:" in cmd and cmd[cmd.index("--python-version") + 1] == "3.12"
    assert cmd[cmd.index("--implementation") + 1] == "cp"
    platforms = {cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--platform"}
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64"} <= platforms


def test_the_tokenizer_files_present_are_copied(tmp_path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "tokenizer.json").write_text("{}")
    (source / "model.safetensors").write_text("weights")
    copied = fetch.copy_tokenizer(source, tmp_path / "carry" / "tokenizer")
    assert [p.name for p in copied] == ["tokenizer.json"]
    assert not (tmp_path / "carry" / "tokenizer" / "model.safetensors").exists()
