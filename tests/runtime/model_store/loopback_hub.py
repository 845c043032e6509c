"""A small Hugging Face hub on 127.0.0.1, for the real ``huggingface_hub`` client.

It serves the routes the client calls to find and fetch a model's files::

    GET  /api/models/ORG/NAME[/revision/REV]          model_info: sha, siblings
    GET  /api/models/ORG/NAME/tree/REV[?recursive=1]  the file listing (snapshot_download)
    HEAD /ORG/NAME/resolve/REV/PATH                   a file's commit, etag and size
    GET  /ORG/NAME/resolve/REV/PATH                   the file (from a ``Range``'s start)

as the hub answers them: ``X-Repo-Commit``, ``ETag``, ``X-Error-Code`` (RepoNotFound,
RevisionNotFound, EntryNotFound, GatedRepo) with 404 / 401 / 403. A gated repository
admits only ``Authorization: Bearer <its token>``. Every request is recorded, so tests
can say which files were fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["HubRepo", "LoopbackHub", "Recorded"]


@dataclass
class HubRepo:
    """A repository: ``commits`` maps a commit sha to its files (path -> bytes),
    ``refs`` a branch or tag to a commit; ``token``: set for a gated repository."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    token: str | None = None

    def add_commit(self, files: dict[str, bytes], ref: str = "main") -> str:
        """Adds a commit of ``files`` and points ``ref`` at it; returns its sha."""
        sha = hashlib.sha1(repr(sorted(files.items())).encode() + ref.encode()).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        return sha

    @staticmethod
    def files_of(directory: Path) -> dict[str, bytes]:
        """Every file under ``directory``, by its path there."""
        return {
            str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # by lower-case name


class LoopbackHub:
    """The hub, serving ``repos`` (repo id -> HubRepo) on 127.0.0.1 from a thread."""

    def __init__(self, repos: dict[str, HubRepo]) -> None:
        self.repos = repos
        self.requests: list[Recorded] = []
        # file name -> bytes: the next GET of that file sends only these many, then
        # drops the connection (a download cut short)
        self.cut_after: dict[str, int] = {}
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LoopbackHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def fetched(self) -> list[str]:
        """The files downloaded (GET of a resolve route) since the last ``clear``, in order."""
        return [r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in self._gets()]

    def clear(self) -> None:
        self.requests.clear()

    def _gets(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path]


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.owner.requests.append(
            Recorded(self.command, path, {k.lower(): v for k, v in self.headers.items()})
        )
        if path.startswith("/api/models/"):
            self._api(path.removeprefix("/api/models/"))
        elif "/resolve/" in path:
            self._resolve(path.lstrip("/"), head)
        else:
            self._error(404, "EntryNotFound", "no such route")

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if repo.token is not None:
            given = self.headers.get("Authorization")
            if given is None:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted.")
                return None
            if given != f"Bearer {repo.token}":
                self._error(403, "GatedRepo", f"Access to model {repo_id} is not granted.")
                return None
        return repo

    def _commit(self, repo: HubRepo, revision: str) -> str | None:
        sha = revision if revision in repo.commits else repo.refs.get(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def _api(self, rest: str) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        repo = self._repo(repo_id)
        if repo is None:
            return
        revision = tail[1] if len(tail) >= 2 and tail[0] in ("revision", "tree") else "main"
        sha = self._commit(repo, revision)
        if sha is None:
            return
        files = repo.commits[sha]
        if tail and tail[0] == "tree":
            listing = [
                {"type": "file", "path": p, "size": len(b), "oid": _blob_id(b)}
                for p, b in sorted(files.items())
            ]
            self._json(listing)
            return
        info = {
            "id": repo_id,
            "sha": sha,
            "private": False,
            "gated": "auto" if repo.token else False,
            "siblings": [{"rfilename": p} for p in sorted(files)],
        }
        self._json(info)

    def _resolve(self, path: str, head: bool) -> None:
        repo_part, rest = path.split("/resolve/", 1)
        revision, filename = rest.split("/", 1)
        repo = self._repo(repo_part)
        if repo is None:
            return
        sha = self._commit(repo, revision)
        if sha is None:
            return
        data = repo.commits[sha].get(filename)
        if data is None:
            self._error(404, "EntryNotFound", f"{filename} not found")
            return
        start = 0
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            start = int(ranged.removeprefix("bytes=").split("-")[0])
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(body) if not head else len(data)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        cut = None if head else self.owner.cut_after.pop(filename, None)
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        if not head:
            self.wfile.write(body)

    def _json(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
