"""What the tests share and the wheel does not ship (pyproject.toml puts ``tests/`` on the path of pytest): the
installed release's facts for skipping and selecting tests (:mod:`.releases`), and the fixtures of single
subjects (:mod:`.kimi_k2x`, :mod:`.mla_draft_norms`, :mod:`.hicache_storage`).  What ``eagle3-patches selftest``
runs stays in ``eagle3_patches/testing``."""
