"""The server's plumbing, shared by every protocol: the FastAPI app and uvicorn, options
and shared state, connections, the guard and admission, request and response bodies,
SSE, errors, request ids, tracing, metrics and the health probe."""
