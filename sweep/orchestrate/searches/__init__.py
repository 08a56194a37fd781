"""Search kinds: how a sweep searches (``search.kind``), one module each, behind one interface
(``sweep.orchestrate.searches.base.Search``: what it plans, an optional pass in a worker, what it hands Ray Tune,
what it does on a resume).

Every module ``sweep/orchestrate/searches/_*.py`` is a search kind's behaviour and is imported here; its settings are
its class in ``sweep.config.search_kinds`` and its file ``conf/search/kind/<kind>.yaml``, over the shared base.
"""

import importlib
import pkgutil

from sweep.orchestrate.searches.base import SEARCHES, InWorker, Search, Selection, register, search_for

for _module in pkgutil.iter_modules(__path__):
    if _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SEARCHES", "InWorker", "Search", "Selection", "register", "search_for"]
