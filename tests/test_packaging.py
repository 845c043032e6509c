"""Every folder with an __init__.py is a package listed in pyproject.toml."""

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
