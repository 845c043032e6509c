"""Fixtures the runtime's test packages share."""

from tests.runtime.model_store.hub_fixtures import hub_repos, tiny_hub  # noqa: F401
