"""The HTTP server: OpenAI-compatible routes (``/v1/...``) and SGLang's native ones
over one in-process ``Engine`` (``radixlm serve``; docs/server.md)."""

from radixlm.runtime.entrypoints.http.app import build_app
from radixlm.runtime.entrypoints.http.config import ServerConfig
from radixlm.runtime.entrypoints.http.server import HTTPServer, serve
from radixlm.runtime.entrypoints.http.state import ServerState

__all__ = ["HTTPServer", "ServerConfig", "ServerState", "build_app", "serve"]
