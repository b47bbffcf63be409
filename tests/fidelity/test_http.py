"""The emulator's HTTP bodies are what SGLang 0.5.23's own response models serialize: each chunk,
parsed and re-serialized by the real pydantic / msgspec classes (the installed sglang 0.5.23,
entrypoints/openai/protocol.py and sse_utils.py), gives back the same bytes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

# setup.sh --test installs sglang 0.5.23 (and openai, which its protocol module imports)
from sglang.srt.entrypoints.openai import protocol as real
from sglang.srt.entrypoints.openai import sse_utils

from tests.emulator.conftest import client, small_landscape, start  # noqa: F401  (fixtures)


def _events(body: str) -> list[str]:
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [e.removeprefix("data: ") for e in events[:-1]]


def _pydantic(model: Any, raw: str, **dump: Any) -> None:
    assert model.model_validate_json(raw).model_dump_json(**dump) == raw


def _msgspec(raw: str) -> None:
    chunk = msgspec.json.decode(raw.encode(), type=sse_utils.StreamChunk)
    assert msgspec.json.encode(chunk).decode() == raw


@pytest.mark.parametrize("continuous", [False, True])
def test_stream_chunks_are_the_real_models(start, small_landscape, continuous: bool) -> None:  # noqa: F811
    server = start(["--model-path", "m"], **small_landscape)
    server.wait_ready()
    options = {"include_usage": True, "continuous_usage_stats": continuous}
    with client(server) as c:
        body = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": True, "ignore_eos": True,
                                               "stream_options": options}).text
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                    "stream": True, "ignore_eos": True, "stream_options": options}).text
    *texts, usage = _events(body)
    for raw in texts:
        _pydantic(real.CompletionStreamResponse, raw)
    parsed = [json.loads(raw) for raw in texts]
    # serving_completions.py:374: the last text chunk carries the finish_reason, no empty one after it
    assert [p["choices"][0]["finish_reason"] for p in parsed] == [None] * (len(parsed) - 1) + ["length"]
    assert parsed[-1]["choices"][0]["text"] != ""
    assert all((p["usage"] is None) != continuous for p in parsed)
    _pydantic(real.CompletionStreamResponse, usage, exclude_none=True)  # the usage chunk
    assert json.loads(usage)["usage"] == {"prompt_tokens": json.loads(usage)["usage"]["prompt_tokens"],
                                          "total_tokens": json.loads(usage)["usage"]["total_tokens"],
                                          "completion_tokens": 4, "reasoning_tokens": 0}

    role, *deltas, finish, usage = _events(chat)
    _msgspec(role)  # sse_utils.build_sse_content: the role chunk and the finish chunk
    _msgspec(finish)
    for raw in deltas:
        _pydantic(real.ChatCompletionStreamResponse, raw)
    _pydantic(real.ChatCompletionStreamResponse, usage, exclude_none=True)
    assert json.loads(role)["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert json.loads(finish)["choices"][0]["finish_reason"] == "length"


def test_info_routes_are_the_real_ones(start, small_landscape) -> None:  # noqa: F811
    """0.5.23 http_server.py: /model_info (and its alias /get_model_info), /server_info's
    handshake keys, /ready and /ping, /freeze_gc."""
    server = start(["--model-path", "m"], **small_landscape)
    server.wait_ready()
    with client(server) as c:
        info = c.get("/model_info").json()
        assert c.get("/get_model_info").json() == info
        assert list(info) == ["model_path", "served_model_name", "tokenizer_path", "is_generation",
                              "preferred_sampling_params", "weight_version", "load_format", "reasoning_parser",
                              "tool_call_parser", "disaggregation_mode", "has_image_understanding",
                              "has_audio_understanding", "model_type", "architectures"]
        server_info = c.get("/server_info").json()
        assert {"launch_command", "status", "max_total_num_tokens", "max_req_input_len", "startup_time",
                "internal_states", "version", "frontend"} <= set(server_info)
        assert server_info["status"] == "ready" and server_info["frontend"] == "python"
        assert c.get("/ready").status_code == 200 and c.get("/ping").status_code == 200
        frozen = c.post("/freeze_gc")
        assert frozen.status_code == 200 and frozen.text == "Garbage collection frozen.\n"


@pytest.mark.parametrize(("flag", "options", "usage"), [
    ([], None, False), (["--stream-response-default-include-usage"], None, True),
    (["--stream-response-default-include-usage"], {"include_usage": False}, True), ([], {"include_usage": True}, True),
])
def test_default_include_usage_flag(start, small_landscape, flag: list[str], options: dict[str, Any] | None,  # noqa: F811
                                    usage: bool) -> None:
    """utils.py should_include_usage: the flag adds the usage chunk whatever stream_options say."""
    server = start(["--model-path", "m", *flag], **small_landscape)
    server.wait_ready()
    body: dict[str, Any] = {"prompt": "hi", "max_tokens": 2, "stream": True, "ignore_eos": True}
    if options is not None:
        body["stream_options"] = options
    with client(server) as c:
        events = _events(c.post("/v1/completions", json=body).text)
    assert (json.loads(events[-1])["choices"] == []) is usage
