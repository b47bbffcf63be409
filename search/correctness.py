"""The correctness gate: fixed greedy prompts whose answers must match the baseline's.

A config that speeds the server up by breaking it (NaN logits, a wrong kernel, a bad
quantisation path) still answers, only wrongly. Greedy decoding (temperature 0) with a fixed
``max_tokens`` makes the answers a deterministic fingerprint; the study compares each
trial's answers with the baseline's and flags those that differ. The prompts are data, in
``search/loadtest/correctness_prompts.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from search.errors import RunFailed

PROMPTS: tuple[str, ...] = tuple(json.loads((Path(__file__).parent / "loadtest" / "correctness_prompts.json").read_text()))
MAX_TOKENS = 32


def _request(api: str, prompt: str) -> tuple[str, dict[str, Any]]:
    if api == "generate":
        return "/generate", {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_TOKENS}}
    body: dict[str, Any] = {"model": "default", "temperature": 0.0, "max_tokens": MAX_TOKENS}
    if api == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


def _answer(api: str, data: dict[str, Any]) -> str:
    if api == "generate":
        return str(data["text"])
    choice = data["choices"][0]
    return str(choice["message"]["content"] if api == "chat" else choice["text"])


def collect_answers(url: str, api: str = "completions", timeout: float = 120.0) -> list[str]:
    """The server's greedy answer to each of :data:`PROMPTS`, in order.

    Raises RunFailed when the server cannot answer (the trial records it as a crash).
    """
    url = url.rstrip("/")
    answers = []
    with httpx.Client(timeout=timeout) as client:
        for prompt in PROMPTS:
            path, body = _request(api, prompt)
            try:
                resp = client.post(url + path, json=body)
                resp.raise_for_status()
                answers.append(_answer(api, resp.json()))
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                raise RunFailed(f"correctness prompt {len(answers)} failed at {url}{path}: {exc}") from None
    return answers


def compare(baseline: list[str], answers: list[str]) -> list[int]:
    """Indices of the prompts whose answers differ from the baseline's (a missing answer differs)."""
    n = max(len(baseline), len(answers))
    return [i for i in range(n) if i >= len(baseline) or i >= len(answers) or baseline[i] != answers[i]]
