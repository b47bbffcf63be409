"""What the requests of a load test look like, with ``sglang.bench_serving``'s dataset definitions.

- ``random`` (bench_serving ``--dataset-name random``): input and output lengths drawn per request
  uniformly from ``[max(int(len * range_ratio), 1), len]`` (``compute_random_lens``); ``range_ratio``
  1 gives the fixed shape.
- ``dataset`` (``sharegpt``, and your own request log): a JSON list or JSONL file of ShareGPT
  conversations (``conversations``: the first turn is the prompt, the second the reply), or of one
  request a line (``prompt`` text or chat ``messages``, optional ``output_len``). Requests are
  shuffled by the seed and replayed in that order. Nothing is tokenized here: the server's ``usage``
  gives the prompt's token count; a reply without ``output_len`` asks for its text's length at
  ``CHARS_PER_TOKEN`` (pass ``output_len`` to fix it, as ``--sharegpt-output-len`` does).
- ``shared_prefix`` (``generated-shared-prefix``): ``groups`` random system prompts of
  ``system_prompt_len`` tokens, each followed by ``prompts_per_group`` random questions of
  ``question_len`` tokens, asking ``output_len`` tokens; shuffled by the seed.

A workload is data (frozen dataclasses, pickled to worker processes); ``requests_of`` turns it into
the request list :class:`search.loadtest.client.Prompts` serialises.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search.errors import BadInput

CHARS_PER_TOKEN = 4  # a reply's length in tokens when the file does not give ``output_len``
# Token ids drawn from a range every common vocabulary (32k and up) covers, past the special tokens.
TOKEN_LO, TOKEN_HI = 1000, 30000


def random_len(rng: random.Random, full: int, ratio: float) -> int:
    """A length uniform in ``[max(int(full * ratio), 1), full]``: bench_serving's ``compute_random_lens``."""
    return rng.randint(max(int(full * ratio), 1), full)


@dataclass(frozen=True)
class SharedPrefix:
    """bench_serving's generated shared prefix: ``groups`` x ``prompts_per_group`` requests."""

    groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group", "system_prompt_len", "question_len"):
            if getattr(self, name) < 1:
                raise BadInput(f"shared_prefix: {name} must be at least 1, got {getattr(self, name)}")

    @property
    def input_len(self) -> int:
        return self.system_prompt_len + self.question_len


@dataclass(frozen=True)
class Request:
    """One request as sent: the prompt (token ids, text, or chat messages) and the output it asks."""

    prompt: list[int] | str | list[dict[str, Any]]
    input_len: int  # tokens when known (ids), else an estimate until the server's usage says
    output_len: int


def shared_prefix_requests(sp: SharedPrefix, output_len: int, seed: int) -> list[Request]:
    """Every group's system prompt followed by each of its questions, shuffled by ``seed``."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]

    requests: list[Request] = []
    for _ in range(sp.groups):
        system = ids(sp.system_prompt_len)
        requests.extend(Request(system + ids(sp.question_len), sp.input_len, output_len)
                        for _ in range(sp.prompts_per_group))
    rng.shuffle(requests)
    return requests


def _dataset_entry(item: Any, where: str, default_output: int) -> Request | None:
    """A request from one file entry; None for a ShareGPT conversation too short to use."""
    if not isinstance(item, dict):
        raise BadInput(f"{where}: expected an object with conversations, prompt or messages")
    output = item.get("output_len")
    if output is not None and (not isinstance(output, int) or output < 1):
        raise BadInput(f"{where}: output_len must be a positive integer, got {output!r}")
    if "conversations" in item:
        turns = item["conversations"]
        if not isinstance(turns, list) or len(turns) < 2:
            return None  # bench_serving skips conversations without a reply
        prompt, reply = (str((t or {}).get("value", "")) for t in turns[:2])
        output = output or max(1, math.ceil(len(reply) / CHARS_PER_TOKEN))
    elif isinstance(item.get("prompt"), str):
        prompt = item["prompt"]
    elif isinstance(item.get("messages"), list):
        text = "".join(str(m.get("content", "")) for m in item["messages"] if isinstance(m, dict))
        return Request(item["messages"], max(1, len(text) // CHARS_PER_TOKEN), output or default_output)
    else:
        raise BadInput(f"{where}: an entry needs conversations (ShareGPT), prompt (text) or messages (chat)")
    return Request(prompt, max(1, len(prompt) // CHARS_PER_TOKEN), output or default_output)


def dataset_requests(path: str, default_output: int, seed: int, api: str = "chat") -> list[Request]:
    """The file's requests, shuffled by ``seed`` (bench_serving shuffles ShareGPT the same way).

    Chat ``messages`` go only to the chat API: for another ``api`` such a file is refused here,
    before anything is sent, rather than failing request by request.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"dataset {path}: cannot read it ({exc.strerror or exc}); give a JSON or JSONL file") from None
    try:
        stripped = text.lstrip()
        items = json.loads(text) if stripped.startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise BadInput(f"dataset {path}: not JSON or JSONL (line {exc.lineno}: {exc.msg})") from None
    requests = [r for i, item in enumerate(items)
                if (r := _dataset_entry(item, f"dataset {path}: entry {i + 1}", default_output))]
    if not requests:
        raise BadInput(f"dataset {path}: no usable request in it")
    if api != "chat" and any(isinstance(r.prompt, list) and r.prompt and isinstance(r.prompt[0], dict)
                             for r in requests):
        raise BadInput(f"dataset {path}: it has chat messages, which only the chat API takes; use api chat")
    random.Random(seed).shuffle(requests)
    return requests
