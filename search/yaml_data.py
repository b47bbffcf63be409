"""The package's own YAML data (log signatures, SGLang's advice), read with libyaml's C loader.

Every process that watches a log or plans a trial reads these files at start; PyYAML's pure-Python
loader takes ~7x longer on them than libyaml (which PyYAML's wheels bundle), and those starts
add up over a study and the test suite. User files (spaces, hosts) keep the pure-Python loader, whose
error messages quote the offending line.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read(*parts: str) -> Any:
    """The parsed YAML file at ``parts`` under the ``search`` package (None for an empty file)."""
    return yaml.load(resources.files("search").joinpath(*parts).read_text(encoding="utf-8"), Loader=_LOADER)
