"""The shared servers of tests/e2e (tests/e2e/e2e_servers.py)."""

from e2e_servers import (  # noqa: F401 - fixtures
    baseline,
    eagle3,
    eagle3_sampled,
    eagle3_sampling,
    eagle_unguarded,
    measured,
    models,
)
