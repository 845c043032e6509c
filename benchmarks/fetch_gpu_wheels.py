"""Fills benchmarks/.gpu_carry/ with what gpu_check.py needs on a GPU machine that has
no network: the cp312 manylinux wheels of the packages it lacks, pinned to this venv's
installed versions, and the default model's tokenizer files.

    wheels/     the wheels (``pip download --no-deps --only-binary=:all:``), one
                version of each: the closure of ``NEEDED``'s requirements in this venv,
                less what the GPU machine already has (``ON_GPU``)
    tokenizer/  the default model's tokenizer files (the constrained and serving
                sections' model: a real BPE vocabulary of 49,152 tokens)

The folder is git-ignored; the device tool carries it (``carry:
["benchmarks/.gpu_carry"]``) and gpu_check installs the wheels itself
(``pip install --no-index --no-deps --target``) when their imports are missing.

Usage: .venv/bin/python benchmarks/fetch_gpu_wheels.py [--dry-run] [--out DIR]
(--dry-run prints the plan, fetches nothing). Needs PyPI (pip) once, here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / "benchmarks" / ".gpu_carry"

# What each gpu_check section needs beyond torch, triton, transformers, safetensors, numpy.
NEEDED: dict[str, tuple[str, ...]] = {
    # the regex constraint's backend (outlines, the default for a regex)
    "constrained": ("outlines-core", "interegular"),
    # radixlm serve (its app imports the tool-call planner's jsonschema) and the client
    "serving": ("fastapi", "uvicorn", "h11", "orjson", "pydantic", "jsonschema", "httpx"),
}

# Distributions the GPU image already holds (device/KINDS.md, read 2026-11-17) that the
# closure may reach: never carried (the machine's own torch stack stays in charge).
# typing-extensions is carried all the same: pydantic-core needs a recent one, and a
# newer one serves torch as well.
ON_GPU = frozenset(
    "annotated-doc anyio attrs certifi charset-normalizer click filelock fsspec hf-xet "
    "httpcore huggingface-hub idna jinja2 markupsafe mpmath networkx numpy packaging "
    "prometheus-client pyyaml regex requests safetensors setuptools sympy tokenizers "
    "torch tqdm transformers triton urllib3 uvloop".split()
)

# pip matches a manylinux tag exactly: the ones cp312 wheels of these packages carry
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# the files a tokenizer needs (transformers' AutoTokenizer); the weights stay behind
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# the target environment's markers: python 3.12 on x86-64 Linux, no extras
MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def normalize(name: str) -> str:
    """PEP 503: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str
    version: str

    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def installed_requires(name: str) -> list[str]:
    return importlib.metadata.requires(name) or []


def installed_version(name: str) -> str:
    return importlib.metadata.version(name)


def plan(
    needed: tuple[str, ...],
    requires: Callable[[str], list[str]] = installed_requires,
    version: Callable[[str], str] = installed_version,
    on_gpu: frozenset[str] = ON_GPU,
) -> list[Pin]:
    """The distributions to carry, each at this venv's version, sorted by name: ``needed``
    and everything they require (markers read for cp312 on x86-64 Linux, extras not
    followed), less ``on_gpu``.

    Raises:
        importlib.metadata.PackageNotFoundError: a needed distribution is not installed.
    """
    pins: dict[str, Pin] = {}
    todo = [normalize(n) for n in needed]
    while todo:
        name = todo.pop()
        if name in pins or name in on_gpu:
            continue
        pins[name] = Pin(name, version(name))
        for line in requires(name):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(MARKERS):
                todo.append(normalize(req.name))
    return sorted(pins.values(), key=lambda p: p.name)


def download_command(pin: Pin, wheels: Path, python_version: str = "3.12") -> list[str]:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
        *platforms, "--dest", str(wheels), pin.spec(),
    ]  # fmt: skip


def default_tokenizer_dir() -> Path:
    from radixlm.runtime.model_store import default_model_dir

    return default_model_dir()


def copy_tokenizer(source: Path, dest: Path) -> list[Path]:
    """The tokenizer files of ``source`` present there, copied into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            copied.append(Path(shutil.copy2(source / name, dest / name)))
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    parser.add_argument("--out", type=Path, default=CARRY)
    parser.add_argument(
        "--python-version",
        default="3.12",
        help="the wheels' Python (3.12: the GPU machine's; another tries the set here)",
    )
    args = parser.parse_args(argv)
    pins = plan(tuple(n for names in NEEDED.values() for n in names))
    print("wheels:", " ".join(p.spec() for p in pins))
    if args.dry_run:
        return 0
    wheels = args.out / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)  # one version of each: two stop the install
    wheels.mkdir(parents=True)
    for pin in pins:
        subprocess.run(download_command(pin, wheels, args.python_version), check=True)
    copied = copy_tokenizer(default_tokenizer_dir(), args.out / "tokenizer")
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{len(pins)} wheels, {len(copied)} tokenizer files: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
