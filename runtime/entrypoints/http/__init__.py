"""The HTTP server: OpenAI-compatible routes (``/v1/...``) and SGLang's native ones
over one in-process ``Engine`` (``radixlm serve``; docs/server.md), one folder per protocol:

    openai/      /v1/chat/completions, /v1/completions, /v1/models
    responses/   /v1/responses
    native/      SGLang's native routes (/generate, /server_info, /metrics, ...)
    compat/      the field names other servers (vLLM, SGLang) define, on those routes
    server/      the plumbing they share: app, uvicorn, config, state, guard, bodies, errors
"""

from radixlm.runtime.entrypoints.http.server.app import build_app
from radixlm.runtime.entrypoints.http.server.config import ServerConfig
from radixlm.runtime.entrypoints.http.server.serve import HTTPServer, serve
from radixlm.runtime.entrypoints.http.server.state import ServerState

__all__ = ["HTTPServer", "ServerConfig", "ServerState", "build_app", "serve"]
