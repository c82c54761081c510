"""The shared servers of tests/e2e (tests/e2e/e2e_servers.py)."""

from e2e_servers import baseline, eagle3, eagle3_sampled, eagle_unguarded, measured, models  # noqa: F401 - fixtures
