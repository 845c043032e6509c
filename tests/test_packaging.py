"""Every folder with an __init__.py is a package listed in pyproject.toml, and
every non-Python source a package needs at run time is declared as its data."""

import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PREFIX = {"lang": "radixlm", "runtime": "radixlm.runtime", "kernels": "radixlm.kernels"}


def test_every_subpackage_is_listed():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, name in PREFIX.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed


def test_kernel_sources_are_package_data():
    """The C++ kernels are compiled on the user's machine: a wheel must carry them."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["radixlm.kernels.cpu"]
    sources = sorted((ROOT / "kernels" / "cpu").glob("*.cpp")) + sorted(
        (ROOT / "kernels" / "cpu").glob("*.h")
    )
    assert sources
    for source in sources:
        assert any(source.match(pattern) for pattern in patterns), source.name


def test_the_cpu_paths_table_is_package_data():
    """The engine picks its CPU paths from the measured table: a wheel must carry it."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["radixlm.runtime.executor"]
    table = ROOT / "runtime" / "executor" / "cpu_paths_table.json"
    assert table.is_file()
    assert any(table.match(pattern) for pattern in patterns)
