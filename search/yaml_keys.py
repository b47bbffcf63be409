"""Keys given twice in one YAML mapping.

YAML loaders keep the last of two equal keys without a word, so a space file that sets
``--max-running-requests`` in two places searches only the second: an edit that never takes
effect. The user files (spaces, hosts) are checked for them before they are read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import yaml


@dataclass(frozen=True)
class DuplicateKey:
    """``key`` (dotted path from the top) is given on ``first`` and again on ``again`` (1-based lines)."""

    key: str
    first: int
    again: int

    @property
    def message(self) -> str:
        return f"given twice, on lines {self.first} and {self.again} (the later one would silently win); keep one"

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def duplicate_keys(text: str) -> list[DuplicateKey]:
    """Every key given twice in a mapping of ``text``, in file order; [] for text that is not YAML
    (the loader then reports that)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []
    return list(_walk(root, ())) if root is not None else []


def _walk(node: yaml.Node, path: tuple[str, ...]) -> Iterator[DuplicateKey]:
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _walk(item, (*path, str(i)))
    elif isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}  # (tag, text): 4 and "4" are different keys
        for key, value in node.value:
            name = str(key.value)
            line = seen.setdefault((key.tag, name), key.start_mark.line + 1)
            if line != key.start_mark.line + 1:
                yield DuplicateKey(".".join((*path, name)), line, key.start_mark.line + 1)
            yield from _walk(value, (*path, name))
