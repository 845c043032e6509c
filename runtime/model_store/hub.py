"""Models by hub id, as users type them: ``ORG/NAME`` (a Hugging Face repository) or
``ORG/NAME-GGUF:Q4_K_M`` (one quantization of a repository of GGUF files).

Files come through ``huggingface_hub`` into its standard cache (``HF_HOME`` /
``HF_HUB_CACHE``: the files transformers would use), with its progress bars, resumed
downloads, ``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``: it reads those itself::

    "ORG/NAME[:QUANT]" -> HubId
      hub reachable:   model_info (the file list) -> serving_files / pick_gguf
                       -> snapshot_download / hf_hub_download (only those files; every
                          part of a GGUF split into files)
      offline or hub unreachable: the cached snapshot of the revision (refs/<revision>)

Only what serving needs is fetched: safetensors shards and their index (``.bin`` /
``.pth`` only when a repository has no safetensors), the configs, and the tokenizer and
chat-template files. The hub's refusals become our errors, each naming the model and
saying what to do.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError
from radixlm.runtime.model_store.gguf_split import split_part_names

__all__ = [
    "HubId",
    "HubModel",
    "fetch_hub_model",
    "gguf_parts",
    "parse_hub_id",
    "pick_gguf",
    "serving_files",
]

# ORG/NAME, then an optional :QUANT (the hub's own rule for names: letters, digits, - _ .)
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<quant>[\w.-]+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# Files of a Hugging Face directory serving reads, besides the weights (top level only).
_METADATA_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template.*",
    "*.tiktoken",
)
_SAFETENSORS_PATTERNS = ("*.safetensors", "model.safetensors.index.json")
_FALLBACK_WEIGHT_PATTERNS = ("*.bin", "*.bin.index.json", "*.pth")


@dataclass(frozen=True)
class HubId:
    """A model named on the hub: ``repo_id`` (ORG/NAME) and, for a GGUF repository, the
    quantization asked for (``Q4_K_M``: the file whose name carries it), or None."""

    repo_id: str
    quant: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.quant is None else f"{self.repo_id}:{self.quant}"


@dataclass(frozen=True)
class HubModel:
    """A hub model's local files: ``model_dir`` (the cached snapshot) and, for a GGUF
    repository, the one GGUF file picked (inside that snapshot; a split GGUF's first
    part, the others beside it), else None."""

    model_dir: Path
    gguf: Path | None = None


def parse_hub_id(text: str) -> HubId | None:
    """``ORG/NAME`` or ``ORG/NAME:QUANT`` as a HubId; None for anything else (a path)."""
    match = _HUB_ID.fullmatch(text)
    if match is None or ".." in text or text.endswith("."):
        return None
    return HubId(match["repo"], match["quant"])


def serving_files(names: list[str]) -> list[str]:
    """The files of a repository (``names``: its paths) that serving it needs: top-level
    safetensors weights (``.bin`` / ``.pth`` only where there are none), configs, and
    the tokenizer and chat-template files."""
    top = [n for n in names if "/" not in n]
    weights = _matching(top, _SAFETENSORS_PATTERNS) or _matching(top, _FALLBACK_WEIGHT_PATTERNS)
    return sorted({*weights, *_matching(top, _METADATA_PATTERNS)})


def pick_gguf(hub_id: HubId, names: list[str], gguf_file: str | None = None) -> str:
    """The GGUF file to serve of a repository holding ``names``: ``gguf_file`` when
    given, else the one whose name carries ``hub_id.quant`` (between ``.``, ``-``, ``_``
    or ``/`` and a ``.`` or ``-``; any case), else the only one there is. A GGUF split
    into files (``-00001-of-0000N.gguf``) counts as one: its first part
    (``gguf_parts`` lists them all).

    Raises:
        ModelNotFoundError: no file fits (the message lists the repository's GGUF files).
        ModelLoadError: several fit (listed, with how to name one).
    """
    ggufs = sorted({_first_part(n) for n in names if n.lower().endswith(".gguf")})
    choices = ", ".join(ggufs) or "none"
    if gguf_file is not None:
        if gguf_file not in names or _first_part(gguf_file) not in ggufs:
            raise ModelNotFoundError(
                f"{hub_id.repo_id} has no GGUF file {gguf_file!r}; it has: {choices}"
            )
        return _first_part(gguf_file)
    if hub_id.quant is None:
        if len(ggufs) == 1:
            return ggufs[0]
        raise ModelLoadError(
            f"{hub_id.repo_id} holds {len(ggufs)} GGUF files: name one quantization as "
            f"{hub_id.repo_id}:QUANT (e.g. :Q4_K_M) or pass --gguf-file; its files: {choices}"
        )
    carries = re.compile(rf"(?:^|[./_-]){re.escape(hub_id.quant)}(?:[.-]|$)", re.IGNORECASE)
    matches = [n for n in ggufs if carries.search(n)]
    if not matches:
        raise ModelNotFoundError(
            f"{hub_id.repo_id} has no GGUF file of quantization {hub_id.quant}; "
            f"its files: {choices}"
        )
    if len(matches) > 1:
        raise ModelLoadError(
            f"{hub_id} is ambiguous: {len(matches)} files carry {hub_id.quant} "
            f"({', '.join(matches)}); pass --gguf-file with one of them"
        )
    return matches[0]


def gguf_parts(hub_id: HubId, gguf_file: str, names: list[str]) -> list[str]:
    """The files of the GGUF ``gguf_file`` (a repository's, holding ``names``): every
    part of a GGUF split into files, the first first; else ``gguf_file`` alone.

    Raises:
        ModelNotFoundError: a part is not in the repository (named).
    """
    parts = split_part_names(gguf_file) or [gguf_file]
    missing = [part for part in parts if part not in names]
    if missing:
        raise ModelNotFoundError(
            f"{hub_id.repo_id} holds {gguf_file}, part of a GGUF split into {len(parts)} "
            f"files, without {', '.join(missing)}"
        )
    return parts


def fetch_hub_model(
    hub_id: HubId, revision: str | None = None, gguf_file: str | None = None, gguf: bool = False
) -> HubModel:
    """The model's files in the hub cache, downloaded first where missing.

    Args:
        hub_id: the repository (and the GGUF quantization, if named).
        revision: a branch, tag or commit (None: the default branch).
        gguf_file: the GGUF file to serve, by its path in the repository.
        gguf: serve a GGUF file even if the repository also has safetensors weights.
            A repository with a quantization or ``gguf_file`` named, or with GGUF files
            and no config.json, is served from a GGUF file too.

    Raises:
        ModelNotFoundError: the repository, revision or file is not on the hub (404), or
            not in the cache when offline or the hub cannot be reached.
        ModelLoadError: the hub asks for a token (401) or refuses this one (403), or a
            download failed.
    """
    names = _list_files(hub_id, revision)
    if names is None:  # offline, or the hub cannot be reached: the cache alone
        return _cached_model(hub_id, revision, gguf_file, gguf)
    wants_gguf = gguf or hub_id.quant is not None or gguf_file is not None
    if wants_gguf or ("config.json" not in names and any(n.endswith(".gguf") for n in names)):
        parts = gguf_parts(hub_id, pick_gguf(hub_id, names, gguf_file), names)
        paths = [Path(_download(hub_id, revision, "hf_hub_download", filename=p)) for p in parts]
        return HubModel(paths[0].parent, paths[0])
    files = serving_files(names)
    if "config.json" not in files:
        raise ModelLoadError(
            f"{hub_id.repo_id} has no config.json (and no GGUF file): it is no model "
            "radixlm can serve"
        )
    return HubModel(Path(_download(hub_id, revision, "snapshot_download", allow_patterns=files)))


def _matching(names: list[str], patterns: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _first_part(name: str) -> str:
    """The first part's name of the split GGUF ``name`` is a part of; else ``name``."""
    parts = split_part_names(name)
    return name if parts is None else parts[0]


# ---------------------------------------------------------------------------------------------
# The hub (huggingface_hub, imported on first use: an engine on a local directory never needs it)


def _list_files(hub_id: HubId, revision: str | None) -> list[str] | None:
    """The repository's file paths at ``revision``; None when offline or unreachable."""
    # lazy: huggingface_hub
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().model_info(hub_id.repo_id, revision=revision)
    except HfHubHTTPError as e:
        if _status(e) is not None and _status(e) < 500:  # type: ignore[operator]
            raise _refusal(e, hub_id, revision) from e
        return None  # the hub is down: perhaps the cache has it
    except (*_network_errors(), OSError):
        return None
    return [s.rfilename for s in info.siblings or []]


def _download(hub_id: HubId, revision: str | None, how: str, **kwargs: Any) -> str:
    """``huggingface_hub.<how>(repo, revision=..., **kwargs)``, its errors ours."""
    # lazy: huggingface_hub
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return getattr(huggingface_hub, how)(hub_id.repo_id, revision=revision, **kwargs)
    except HfHubHTTPError as e:
        raise _refusal(e, hub_id, revision) from e
    except (*_network_errors(), OSError) as e:
        raise ModelLoadError(
            f"downloading {hub_id} failed ({type(e).__name__}: {e}); run the command again "
            "to resume it"
        ) from e


def _refusal(error: Exception, hub_id: HubId, revision: str | None) -> ModelLoadError:
    """The hub's refusal (401, 403, 404, a missing revision) as our error."""
    # lazy: huggingface_hub
    from huggingface_hub.errors import RevisionNotFoundError

    endpoint = _endpoint()
    if isinstance(error, RevisionNotFoundError):
        return ModelNotFoundError(
            f"{hub_id.repo_id} has no revision {revision!r} on {endpoint}: name one of its "
            "branches, tags or commits with --revision"
        )
    status = _status(error)
    if status == 401:
        return ModelLoadError(
            f"{hub_id.repo_id}: {endpoint} asks for a token (401): the model is gated or private "
            "(or its name is misspelled); set HF_TOKEN to a token of an account with access "
            "(https://huggingface.co/settings/tokens)"
        )
    if status == 403:
        return ModelLoadError(
            f"{hub_id.repo_id}: {endpoint} refuses the token given (403): accept the model's "
            f"terms at {endpoint}/{hub_id.repo_id} with the account of HF_TOKEN, or use a "
            "token with read access to it"
        )
    if status == 404:
        return ModelNotFoundError(
            f"{hub_id.repo_id} is not on {endpoint} (404), nor a local path: check the name "
            "(ORG/NAME), or give a model directory or a .gguf file"
        )
    return ModelLoadError(f"{endpoint} answered {status} for {hub_id}: {error}")


def _cached_model(
    hub_id: HubId, revision: str | None, gguf_file: str | None, gguf: bool
) -> HubModel:
    """The model from the hub cache alone (``HF_HUB_OFFLINE``, or the hub unreachable)."""
    snapshot = _cached_snapshot(hub_id.repo_id, revision or "main")
    if snapshot is None:
        raise ModelNotFoundError(
            f"{hub_id} (revision {revision or 'main'}) is not in the hub cache "
            f"({_cache_dir()}) and {_why_offline()}: download it once where the hub can be "
            f"reached (`radixlm pull {hub_id}`), or give a local path"
        )
    names = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    wants_gguf = gguf or hub_id.quant is not None or gguf_file is not None
    if wants_gguf or "config.json" not in names:
        path = snapshot / pick_gguf(hub_id, names, gguf_file)
        return HubModel(snapshot, path)
    return HubModel(snapshot)


def _cached_snapshot(repo_id: str, revision: str) -> Path | None:
    """The cache's snapshot directory of ``revision`` (a commit, or a branch or tag the
    cache has a ref of), by the cache's documented layout; None if it has none."""
    storage = Path(_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    commit = revision
    if not _COMMIT.fullmatch(revision):
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _status(error: Exception) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a client raises when the hub cannot be reached (by huggingface_hub's HTTP
    library of the installed version), and when offline mode forbids asking it."""
    # lazy: huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    errors: list[type[BaseException]] = [OfflineModeIsEnabled, ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _endpoint() -> str:
    # lazy: huggingface_hub
    from huggingface_hub import constants

    return constants.ENDPOINT


def _cache_dir() -> str:
    # lazy: huggingface_hub
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _why_offline() -> str:
    # lazy: huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    return f"{constants.ENDPOINT} cannot be reached"
