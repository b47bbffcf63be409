"""The emulator's HTTP bodies are what SGLang 0.5.23's own response models serialize: each chunk,
parsed and re-serialized by the real pydantic / msgspec classes (the installed sglang 0.5.23,
entrypoints/openai/protocol.py and sse_utils.py), gives back the same bytes."""

from __future__ import annotations

import json
from typing import Any

import httpx
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


def _stream_both(server: Any, options: dict[str, bool]) -> tuple[str, str]:
    """The raw event streams of one 4-token completion and one 4-token chat with ``options``."""
    with client(server) as c:
        body = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": True, "ignore_eos": True,
                                               "stream_options": options}).text
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                    "stream": True, "ignore_eos": True, "stream_options": options}).text
    return body, chat


@pytest.mark.parametrize("continuous", [False, True])
def test_stream_chunks_are_the_real_models(start, small_landscape, continuous: bool) -> None:  # noqa: F811
    server = start(["--model-path", "m"], **small_landscape)
    server.wait_ready()
    options = {"include_usage": True, "continuous_usage_stats": continuous}
    body, chat = _stream_both(server, options)
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


# Run inside the older wheel's own source (PYTHONPATH=.whl/src/sglang-<version>): re-serialize each
# chunk with that version's protocol.py models.
_RESERIALIZE = r"""
import json, sys
from sglang.srt.entrypoints.openai import protocol as real
bad = []
for model, raw, dump in json.load(sys.stdin):
    got = getattr(real, model).model_validate_json(raw).model_dump_json(**dump)
    if got != raw:
        bad.append([model, raw, got])
print(json.dumps(bad))
"""


def _reserialize(version: str, cases: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
    import os
    import subprocess
    import sys

    from tests.fidelity.realsource import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT / f"sglang-{version}")}
    out = subprocess.run([sys.executable, "-c", _RESERIALIZE], input=json.dumps(cases), env=env, text=True,
                         capture_output=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("version", ["0.5.8.post1", "0.5.9"])
def test_older_versions_stream_their_own_chunks(start, small_landscape, version: str) -> None:  # noqa: F811
    """0.5.9 / 0.5.8.post1: every chat chunk is a pydantic ChatCompletionStreamResponse dumped whole
    (serving_chat.py 0.5.9:679/:799/:857), the usage has no completion_tokens_details, and
    0.5.8.post1's completions ignore continuous_usage_stats."""
    server = start(["--model-path", "m"], SEARCH_EMULATOR_SGLANG_VERSION=version, **small_landscape)
    server.wait_ready()
    options = {"include_usage": True, "continuous_usage_stats": True}
    body, chat = _stream_both(server, options)
    *texts, usage = _events(body)
    *chunks, chat_usage = _events(chat)
    cases = [("CompletionStreamResponse", raw, {}) for raw in texts]
    cases += [("CompletionStreamResponse", usage, {"exclude_none": True})]
    cases += [("ChatCompletionStreamResponse", raw, {}) for raw in [*chunks, chat_usage]]
    assert _reserialize(version, cases) == []
    parsed = [json.loads(raw) for raw in texts]
    assert [p["choices"][0]["finish_reason"] for p in parsed] == [None] * (len(parsed) - 1) + ["length"]
    assert all((p["usage"] is None) == (version == "0.5.8.post1") for p in parsed)
    assert json.loads(chat_usage)["usage"]["prompt_tokens_details"] is None  # dumped whole
    assert "completion_tokens_details" not in json.loads(chat_usage)["usage"]


def _model_info_keys(version: str) -> list[str]:
    """The keys of the dict model_info() builds in the version's http_server.py, in order."""
    import ast

    from tests.fidelity.realsource import ROOT

    tree = ast.parse((ROOT / f"sglang-{version}/sglang/srt/entrypoints/http_server.py").read_text())
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "model_info")
    result = next(n for n in ast.walk(func) if isinstance(n, ast.Dict))
    keys = [k.value for k in result.keys if isinstance(k, ast.Constant)]
    return list(dict.fromkeys(keys))


@pytest.mark.parametrize("version", ["0.5.8.post1", "0.5.9", "0.5.23"])
def test_info_routes_per_version(start, small_landscape, version: str) -> None:  # noqa: F811
    """/model_info has the keys the version's model_info() builds; /server_info the server args, the
    scheduler's handshake and the rest; /ready is 0.5.23's; /get_model_info warns; /generate
    returns text, output_ids and meta_info (tokenizer_manager.py 0.5.23:2507, 0.5.9:1494)."""
    server = start(["--model-path", "m"], SEARCH_EMULATOR_SGLANG_VERSION=version, **small_landscape)
    server.wait_ready()
    with client(server) as c:
        info = c.get("/model_info").json()
        assert list(info) == _model_info_keys(version)
        assert c.get("/get_model_info").json() == info
        server_info = c.get("/server_info").json()
        assert {"status", "max_total_num_tokens", "max_req_input_len", "internal_states", "version"} <= set(server_info)
        assert ("launch_command" in server_info) == (version == "0.5.23")
        assert c.get("/ready").status_code == (200 if version == "0.5.23" else 404)
        assert c.get("/ping").status_code == 200
        out = c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}).json()
    assert list(out) == ["text", "output_ids", "meta_info"] and len(out["output_ids"]) == 3
    retractions = ["total_retractions"] if version != "0.5.23" else ["num_retractions", "reasoning_tokens"]
    assert list(out["meta_info"]) == ["id", "finish_reason", "prompt_tokens", "weight_version", *retractions,
                                      "completion_tokens", "cached_tokens", "e2e_latency"]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    server.wait_for("Endpoint '/get_model_info' is deprecated")


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_a_finish_on_eos_names_the_token(start, small_landscape, version: str) -> None:  # noqa: F811
    """FINISH_MATCHED_TOKEN.to_json's "matched" becomes matched_stop (serving_completions.py):
    the EOS id, in the chunk that finishes and in a whole response."""
    from search.emulator import tokens

    server = start(["--model-path", "m"], SEARCH_EMULATOR_SGLANG_VERSION=version, **small_landscape)
    server.wait_ready()
    body = {"prompt": "hi", "max_tokens": 1000}
    with client(server) as c:
        whole = c.post("/v1/completions", json=body).json()
        events = _events(c.post("/v1/completions", json={**body, "stream": True}).text)
        chat = _events(c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 1000, "stream": True}).text)
    assert whole["choices"][0]["finish_reason"] == "stop" and whole["choices"][0]["matched_stop"] == tokens.EOS_ID
    last, finish = json.loads(events[-1])["choices"][0], json.loads(chat[-1])["choices"][0]
    assert (last["finish_reason"], last["matched_stop"]) == ("stop", tokens.EOS_ID)
    assert (finish["finish_reason"], finish["matched_stop"]) == ("stop", tokens.EOS_ID)
    if version == "0.5.9":
        assert _reserialize(version, [("CompletionStreamResponse", events[-1], {}),
                                      ("ChatCompletionStreamResponse", chat[-1], {})]) == []
    else:
        _pydantic(real.CompletionStreamResponse, events[-1])
        _msgspec(chat[-1])


def test_what_fastapi_adds_is_answered_as_fastapi_answers(start, small_landscape) -> None:  # noqa: F811
    """The emulator runs on Starlette; SGLang on FastAPI (0.5.23 http_server.py:721 `@app.get("/health")`,
    :1025 `@app.api_route("/flush_cache", methods=["GET", "POST"])`, a GET returning a dict as
    `/v1/models` does). A FastAPI app with those routes is the reference for what the framework
    answers on its own: an unknown path, a method the route lacks, a HEAD on a GET route, a dict."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    reference = FastAPI()
    reference.get("/health")(lambda: None)
    reference.api_route("/flush_cache", methods=["GET", "POST"])(lambda: None)
    reference.get("/v1/models")(lambda: {"object": "list"})
    server = start(["--model-path", "m"], **small_landscape)
    server.wait_ready()
    asks = [("GET", "/nosuch"), ("POST", "/health"), ("HEAD", "/health"), ("PUT", "/flush_cache")]

    def allowed(answer: httpx.Response) -> set[str]:  # both frameworks join a set: its order varies by process
        return set(answer.headers.get("allow", "").split(", "))

    with client(server) as ours, TestClient(reference) as theirs:
        for method, path in asks:
            got, want = ours.request(method, path), theirs.request(method, path)
            assert (got.status_code, got.content, allowed(got)) == \
                (want.status_code, want.content, allowed(want)), (method, path)
            assert got.headers.get("content-type") == want.headers.get("content-type"), (method, path)
        models = ours.get("/v1/models")
        assert models.headers["content-type"] == theirs.get("/v1/models").headers["content-type"]
        assert models.json()["object"] == "list"
