"""Deterministic text: a prompt's greedy output is the same words every time, on every config.

Token counts are approximations (a word or punctuation mark per token); token ids count exactly.
"""

from __future__ import annotations

import hashlib
import re

_WORDS = ("the", "model", "answer", "is", "a", "city", "river", "of", "and", "in", "light", "north",
          "capital", "France", "Paris", "large", "system", "token", "fast", "graph", "kernel", "expert",
          "memory", "batch", "result", "value", "time", "world", "data", "simple", "clear", "because")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_CORRUPT = "!"  # what NaN logits decode to: token 0 over and over


def count(text: str) -> int:
    return max(1, len(_TOKEN.findall(text)))


def key(prompt: str | list[int]) -> tuple[object, ...]:
    """The prompt's tokens as the radix cache compares them: ids as sent, or the words of a text."""
    return tuple(prompt) if isinstance(prompt, list) else tuple(_TOKEN.findall(prompt))


def seed_of(prompt: str | list[int]) -> int:
    data = prompt.encode() if isinstance(prompt, str) else ",".join(map(str, prompt)).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def natural_length(seed: int) -> int:
    """Where greedy decoding would stop on its own (EOS) when ignore_eos is off."""
    return 24 + seed % 200


def text(seed: int, start: int, end: int, corrupt: bool = False) -> str:
    """Tokens [start, end) of the output seeded by `seed`."""
    if corrupt:
        return _CORRUPT * (end - start)
    n = len(_WORDS)
    return "".join(" " + _WORDS[((seed >> (j % 48)) + j * 7) % n] for j in range(start, end))


EOS_ID = 151329  # the id the emulator's model stops on (GLM's <|endoftext|>; a stand-in)


def ids(seed: int, start: int, end: int, corrupt: bool = False) -> list[int]:
    """The token ids of tokens [start, end): one id per word of `text`, 0 for a NaN-logits token."""
    if corrupt:
        return [0] * (end - start)
    return [1000 + ((seed >> (j % 48)) + j * 7) % len(_WORDS) for j in range(start, end)]
