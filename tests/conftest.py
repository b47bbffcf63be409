"""Suite-wide collection order: the slowest areas first.

`scripts/test.sh` runs the suite on three workers with pytest-xdist's ``--dist loadfile``, which
hands out whole files in collection order; a long file collected last runs alone at the end while
the others idle. Starting with the areas that run whole studies and clusters (longest
first, as measured by ``--durations``) leaves the quick files to fill the gaps at the end.
"""

from __future__ import annotations

import pytest

SLOW_FIRST = ("tests/ssh/", "tests/parallel/", "tests/report/", "tests/study/", "tests/slots/", "tests/trial/",
              "tests/loadtest/", "tests/strategy/")


def _rank(item: pytest.Item) -> int:
    path = item.nodeid
    return next((i for i, prefix in enumerate(SLOW_FIRST) if path.startswith(prefix)), len(SLOW_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: each area keeps its own order
