"""Linear programs over the polytope of valid attention rows: the per-LP HiGHS route
(`highs`) and the independent check of reported bounds (`verify`)."""
