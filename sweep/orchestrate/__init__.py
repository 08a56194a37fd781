"""Sweeps, in three rooms: the driver and the worker, Ray-free (``driver``, ``plan``, ``writer``, ``claims``;
``worker``, ``report``), the search kinds (``searches``: what each does with its settings, which are
``sweep.config.search_kinds``') and the one Ray adapter (``ray``: every Ray, Ray Tune and Ray Jobs call)."""
