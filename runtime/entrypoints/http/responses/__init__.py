"""OpenAI's Responses API (``/v1/responses``): request models, conversion onto the chat
route's call, response objects and events, the in-memory store, the routes."""
