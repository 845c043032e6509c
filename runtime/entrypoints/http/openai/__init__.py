"""OpenAI's chat completions and completions (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``): request models, prompts and budgets, constraints, tools on the chat route,
conversion to ``GenerateRequest``s, response bodies, the routes."""
