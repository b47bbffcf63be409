"""Every fidelity test reads the real wheels: without them it fails, telling how to get them."""

from __future__ import annotations

import pytest

from tests.fidelity.realsource import require_wheels


@pytest.fixture(autouse=True, scope="session")
def _wheels() -> None:
    require_wheels()
