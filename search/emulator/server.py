"""SGLang's HTTP API on Starlette/uvicorn, backed by the token scheduler.

SGLang serves it with FastAPI, which is Starlette with request models and OpenAPI on top; its
import alone took ~0.6 s of CPU on a 2-core box, at every emulated server start. The emulator
parses bodies by hand (SGLang's own errors, below), so it keeps only what FastAPI adds that a client
can see: JSON bodies for returned dicts and for 404/405 (`{"detail": ...}`), and no HEAD on GET routes.

Streaming bodies are built from per-request byte templates (only the text and counts change per
chunk) so serialization stays cheap at thousands of chunks per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Lifespan

from search.emulator import tokens
from search.emulator.config import Settings
from search.emulator.landscape import Landscape
from search.emulator.logs import Logger
from search.emulator.scheduler import Prefill, Request, Scheduler

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
_WARMUP_PROMPT = "The capital city of France is"
_WARMUP_TRIES = 120  # _execute_server_warmup: one try at /model_info a second


class BadRequest(Exception):
    pass


class Emulator:
    """State shared by the endpoints: flags, plan, scheduler, readiness."""

    def __init__(self, flags: dict[str, Any], env: dict[str, str], plan: dict[str, Any], landscape: Landscape,
                 settings: Settings, log: Logger) -> None:
        self.flags, self.env, self.plan, self.log = flags, env, plan, log
        self.ready = False
        self.on_first_request: Callable[[], None] | None = None
        self.started = time.time()
        self.launch_command = sys.argv[1:]  # server_args.py:717: the argv prepare_server_args was given
        self.model = (flags.get("served_model_name") or flags.get("model_path") or "default")
        self.rank0 = Logger(settings.version, 0 if plan["tp"] > 1 else None, plan["log_ms"])
        graph, prefill_graph = str(plan["cuda_graph"]), str(plan["prefill_graph"])
        # NaN logits (the landscape's `corrupt`), where the version's switches make SGLang say so
        # (launch.nan_warning): every rank's sampler warns, and the server serves on.
        self.nan_ranks = [Logger(settings.version, r if plan["tp"] > 1 else None, plan["log_ms"])
                          for r in range(plan["tp"])] if plan.get("nan_warning") else []
        self.scheduler = Scheduler(
            rate=lambda n: landscape.throughput(flags, env, n), cap=plan["max_running_requests"],
            stream_interval=int(flags.get("stream_interval") or 1), kv_tokens=plan["kv_tokens"],
            noise=settings.noise, seed=settings.seed, log_interval=int(flags.get("decode_log_interval") or 40),
            on_prefill=lambda seqs, new, cached, running, queued, usage, rate: self.batch_line(
                "prefill", seqs=seqs, new=new, cached=cached, running=running, queued=queued, usage=usage,
                rate=rate, prefill_graph=prefill_graph),
            on_decode=lambda running, toks, queued, usage, rate: self.batch_line(
                "decode", running=running, tokens=toks, queued=queued, usage=usage, rate=rate, graph=graph),
            record=bool(flags.get("enable_metrics")), prefill=prefill_of(flags, env, plan, landscape))

    def batch_line(self, key: str, **values: object) -> None:
        self.rank0.say(key, **values)
        self.nan()

    def nan(self) -> None:
        """The sampler's NaN warning on every rank, at each batch line the emulator logs (up to
        0.5.9 `--enable-nan-detection` warns at every step, layers/sampler.py:67); 0.5.23's
        sanitizer warns once per process (utils/async_probe.py:41, its `msg` from
        layers/sampler.py:145)."""
        for log in self.nan_ranks:
            log.say("nan", where="sampler: next_token_logits")
        if self.plan.get("nan_warning") == "once":
            self.nan_ranks = []

    # --- request handling -------------------------------------------------------------------
    def new_request(self, prompt: str | list[int], prompt_tokens: int, max_tokens: int | None, ignore_eos: bool,
                    temperature: float) -> tuple[Request, int]:
        """max_tokens None: no limit but the context, as SGLang's scheduler clamps an unset one."""
        if self.on_first_request is not None:
            first, self.on_first_request = self.on_first_request, None
            first()
        seed = tokens.seed_of(prompt)
        if temperature > 0:
            seed ^= int.from_bytes(os.urandom(8), "little")
        max_req_len = min(self.plan["context_len"], self.plan["kv_tokens"]) - 1
        limit = max_tokens if max_tokens is not None else max(0, max_req_len - prompt_tokens - 1)
        natural = limit if ignore_eos else min(limit, tokens.natural_length(seed))
        req = Request(prompt_tokens, natural, "length" if natural == limit else "stop", tokens.key(prompt))
        self.scheduler.submit(req)
        return req, seed

    async def run(self, req: Request) -> AsyncIterator[int]:
        """Yield req.emitted each time new tokens are out; free the slot however it ends."""
        try:
            while req.state not in ("done", "aborted"):
                await self.scheduler.wait(req)
                if req.emitted:
                    yield req.emitted
        finally:
            self.scheduler.abort(req)

    def text(self, seed: int, start: int, end: int) -> str:
        return tokens.text(seed, start, end, self.plan["corrupt"])


def prefill_of(flags: dict[str, Any], env: dict[str, str], plan: dict[str, Any], landscape: Landscape) -> Prefill:
    """How prefill batches form: the landscape's figures, the flags' budget, policy and cache.

    The budget is --chunked-prefill-size (SGLang's rem_chunk_tokens), or --max-prefill-tokens
    when chunking is off (-1)."""
    figures = landscape.prefill(flags, env)
    chunk = int(plan["chunked_prefill_size"])
    return Prefill(tokens_per_s=figures["tokens_per_s"], batch_overhead_s=figures["batch_overhead_s"],
                   budget=chunk if chunk > 0 else int(plan["max_prefill_tokens"]), chunked=chunk > 0,
                   policy=str(flags.get("schedule_policy") or "fcfs"),
                   radix_cache=not flags.get("disable_radix_cache"))


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                         "code": status}, status_code=status)


async def _body(http: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(await http.body())
    except ValueError as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def _int(body: dict[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise BadRequest(f"'{key}' must be a non-negative integer, got {value!r}.")
    return value


def _sampling(body: dict[str, Any]) -> tuple[float, bool]:
    temperature = body.get("temperature", 1.0 if "temperature" in body else 0.0)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        raise BadRequest(f"'temperature' must be a non-negative number, got {temperature!r}.")
    return float(temperature), bool(body.get("ignore_eos", False))


def _prompt(value: Any) -> tuple[str | list[int], int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str) and value:
        return value, tokens.count(value)
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value, len(value)
    raise BadRequest("'prompt' must be a non-empty string or a list of token ids.")


def _content(message: Any) -> str:
    """A message's text: a string, or OpenAI's list of parts (text parts only: the model reads no images)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest("'messages' must be a non-empty list of {role, content} objects; content is a string "
                     "or a list of {\"type\": \"text\", \"text\": ...} parts.")


def _messages(value: Any) -> tuple[str, int]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects.")
    texts = [_content(m) for m in value]
    joined = "\n".join(f"{m.get('role', 'user')}: {text}" for m, text in zip(value, texts))
    return joined, sum(tokens.count(text) + 4 for text in texts) + 3


def _usage(prompt: int, completion: int, *, exclude_none: bool = False, legacy: bool = False,
           cached: int | None = None) -> dict[str, Any]:
    """UsageInfo (0.5.23 entrypoints/openai/protocol.py:221; 0.5.9 :131 and 0.5.8.post1 :105,
    `legacy`, have no completion_tokens_details) as pydantic dumps it; a usage chunk dumped with
    exclude_none drops the null fields. ``cached``: the radix cache's hits, given only under
    --enable-cache-report (usage_processor.py:39, 81; serving_chat.py:837), as
    PromptTokensDetails ``{"cached_tokens": N}`` (protocol.py:195)."""
    details = None if cached is None else {"cached_tokens": cached}
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                             "completion_tokens": completion, "prompt_tokens_details": details,
                             "reasoning_tokens": 0}
    if not legacy:
        usage["completion_tokens_details"] = None
    return {k: v for k, v in usage.items() if v is not None} if exclude_none else usage


def build_app(emu: Emulator, lifespan: Lifespan[Starlette] | None = None) -> Starlette:
    routes: list[Route] = []

    def route(path: str, *methods: str) -> Callable[[_Endpoint], _Endpoint]:
        def add(endpoint: _Endpoint) -> _Endpoint:
            routes.append(_route(path, endpoint, methods or ("GET",)))
            return endpoint
        return add

    async def health(http: HttpRequest) -> Response:
        if not emu.ready:
            return Response(status_code=503)
        req, _ = emu.new_request("health", 1, 1, True, 0.0)
        try:
            await asyncio.wait_for(_drain(emu, req), float(emu.env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
        except asyncio.TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    route("/health")(health)
    route("/health_generate")(health)

    legacy = emu.log.version != "0.5.23"

    async def ready(_: HttpRequest) -> Response:  # 0.5.23 /ready and /ping: 200 once the warmup request went through
        return Response(status_code=200 if emu.ready else 503)

    async def ping(_: HttpRequest) -> Response:  # 0.5.9 http_server.py:1592 (SageMaker): 200 whenever it answers
        return Response(status_code=200)

    if not legacy:  # /ready is 0.5.23's (http_server.py:714)
        route("/ready")(ready)
    route("/ping")(ping if legacy else ready)

    async def model_info(_: HttpRequest) -> dict[str, Any]:
        """0.5.23 http_server.py:813 model_info (/get_model_info is its deprecated alias); 0.5.9
        http_server.py:554 and 0.5.8.post1 :542 have fewer keys (weight_version given twice there:
        the first place holds)."""
        if legacy:
            return {"model_path": emu.flags.get("model_path"),
                    "tokenizer_path": emu.flags.get("tokenizer_path") or emu.flags.get("model_path"),
                    "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                    "has_image_understanding": False, "has_audio_understanding": False,
                    "model_type": "glm_moe_dsa", "architectures": [emu.plan["arch"]]}
        return {"model_path": emu.flags.get("model_path"), "served_model_name": emu.model,
                "tokenizer_path": emu.flags.get("tokenizer_path") or emu.flags.get("model_path"),
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "load_format": emu.flags.get("load_format"), "reasoning_parser": emu.flags.get("reasoning_parser"),
                "tool_call_parser": emu.flags.get("tool_call_parser"),
                "disaggregation_mode": emu.flags.get("disaggregation_mode"), "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "glm_moe_dsa", "architectures": [emu.plan["arch"]]}

    async def get_model_info(http: HttpRequest) -> dict[str, Any]:
        emu.log.say("get_model_info_deprecated")
        return await model_info(http)

    route("/model_info")(model_info)
    route("/get_model_info")(get_model_info)

    async def server_info(_: HttpRequest) -> dict[str, Any]:
        """0.5.23 http_server.py:864 server_info: the resolved flags, the launch command, the
        scheduler's ready handshake (scheduler.py:1943), the internal states per DP rank."""
        s = emu.scheduler
        if legacy:  # 0.5.9 http_server.py:593: server args, the scheduler's handshake, states, version
            return {**emu.flags, "status": "ready", "max_total_num_tokens": emu.plan["kv_tokens"],
                    "max_req_input_len": min(emu.plan["context_len"], emu.plan["kv_tokens"]) - 1,
                    "internal_states": [{"last_gen_throughput": s.stats.last_gen_throughput,
                                         "memory_usage": {"weight": emu.plan["weights_gib"],
                                                          "kvcache": emu.plan["pool_gib"] - emu.plan["weights_gib"]},
                                         "effective_max_running_requests_per_dp": s.cap}],
                    "version": emu.plan["version"]}
        return {**emu.flags, "launch_command": emu.launch_command, "status": "ready",
                "max_total_num_tokens": emu.plan["kv_tokens"],
                "max_req_input_len": min(emu.plan["context_len"], emu.plan["kv_tokens"]) - 1,
                "startup_time": emu.started, "kv_events": None,
                "internal_states": [{"last_gen_throughput": s.stats.last_gen_throughput,
                                     "memory_usage": {"weight": emu.plan["weights_gib"],
                                                      "kvcache": emu.plan["pool_gib"] - emu.plan["weights_gib"]},
                                     "effective_max_running_requests_per_dp": s.cap}],
                "version": emu.plan["version"], "frontend": "python"}

    async def get_server_info(http: HttpRequest) -> dict[str, Any]:
        emu.log.say("get_server_info_deprecated")
        return await server_info(http)

    route("/server_info")(server_info)
    route("/get_server_info")(get_server_info)

    @route("/freeze_gc", "GET", "POST")
    async def freeze_gc(_: HttpRequest) -> Response:  # http_server.py freeze_gc_async (0.5.23: line 1254)
        return Response(content="Garbage collection frozen.\n", status_code=200)

    @route("/v1/models")
    async def models(_: HttpRequest) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": emu.model, "object": "model", "created": int(time.time()),
                                            "owned_by": "sglang", "root": emu.model, "parent": None,
                                            "max_model_len": emu.plan["context_len"]}]}

    @route("/flush_cache", "GET", "POST")
    async def flush_cache(_: HttpRequest) -> Response:
        if emu.scheduler.num_running or emu.scheduler.queue:
            return Response("Cache not flushed. Please check for pending requests.", status_code=400)
        if emu.scheduler.cache is not None:
            emu.scheduler.cache.reset()
        return Response("Cache flushed.\nPlease check backend logs for more details. (When there are running "
                        "or waiting requests, the operation will not be performed.)\n")

    @route("/v1/completions", "POST")
    async def completions(http: HttpRequest) -> Response:
        body = await _body(http)
        prompt, n_prompt = _prompt(body.get("prompt"))
        return await _openai(emu, body, prompt, n_prompt, chat=False)

    @route("/v1/chat/completions", "POST")
    async def chat(http: HttpRequest) -> Response:
        body = await _body(http)
        prompt, n_prompt = _messages(body.get("messages"))
        return await _openai(emu, body, prompt, n_prompt, chat=True)

    @route("/generate", "POST")
    async def generate(http: HttpRequest) -> Response:
        body = await _body(http)
        if "input_ids" in body:
            prompt, n_prompt = _prompt(body["input_ids"])
        else:
            prompt, n_prompt = _prompt(body.get("text"))
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("'sampling_params' must be an object.")
        temperature, ignore_eos = _sampling(params)
        req, seed = emu.new_request(prompt, n_prompt, _int(params, "max_new_tokens", 128), ignore_eos, temperature)
        rid = uuid.uuid4().hex

        legacy = emu.log.version != "0.5.23"

        def payload(n: int) -> dict[str, Any]:
            """tokenizer_manager._handle_batch_output (0.5.23:2507, 0.5.9:1494): text and output_ids
            so far (stream_output off), meta_info in its order; the finish reason is
            FINISH_LENGTH / FINISH_MATCHED_TOKEN's to_json (schedule_batch.py); e2e_latency once done."""
            done = req.state == "done" and n >= req.target
            finish = None
            if done:
                finish = {"type": "length", "length": req.target} if req.finish_reason == "length" \
                    else {"type": "stop", "matched": tokens.EOS_ID}
            meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": n_prompt,
                                    "weight_version": "default"}
            if legacy:
                meta["total_retractions"] = 0
            else:
                meta.update(num_retractions=0, reasoning_tokens=0)
            meta.update(completion_tokens=n, cached_tokens=req.cached)
            if done:
                meta["e2e_latency"] = time.monotonic() - req.arrived
            return {"text": emu.text(seed, 0, n), "output_ids": tokens.ids(seed, 0, n, emu.plan["corrupt"]),
                    "meta_info": meta}

        if body.get("stream"):
            async def events() -> AsyncIterator[bytes]:
                async for n in emu.run(req):
                    yield b"data: " + json.dumps(payload(n)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        await _drain(emu, req)
        return JSONResponse(payload(req.emitted))

    @route("/metrics")
    async def metrics(_: HttpRequest) -> Response:
        if not emu.flags.get("enable_metrics"):
            return Response("Not Found", status_code=404)
        return Response(_metrics(emu), media_type="text/plain; version=0.0.4")

    async def bad_request(_: HttpRequest, exc: Exception) -> Response:
        return _error(str(exc))

    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={BadRequest: bad_request, HTTPException: _http_error})


_Endpoint = Callable[[HttpRequest], Awaitable[Any]]


def _route(path: str, endpoint: _Endpoint, methods: tuple[str, ...]) -> Route:
    """A route as FastAPI makes it: a returned dict goes out as JSON, and HEAD is not added to GET
    (Starlette adds it; FastAPI, so SGLang, answers a HEAD there with 405)."""
    async def handle(http: HttpRequest) -> Response:
        result = await endpoint(http)
        return result if isinstance(result, Response) else JSONResponse(result)

    made = Route(path, handle, methods=list(methods))
    if "HEAD" not in methods and made.methods is not None:
        made.methods.discard("HEAD")
    return made


async def _http_error(_: HttpRequest, exc: Exception) -> Response:
    """FastAPI's http_exception_handler (fastapi/exception_handlers.py): an unknown path is a JSON 404,
    a known path asked with another method a JSON 405 with its Allow header."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _drain(emu: Emulator, req: Request) -> None:
    async for _ in emu.run(req):
        pass


async def _openai(emu: Emulator, body: dict[str, Any], prompt: str | list[int], n_prompt: int, chat: bool) -> Response:
    temperature, ignore_eos = _sampling(body)
    if chat:  # protocol.py: `self.max_completion_tokens or self.max_tokens` (so a 0 falls through)
        max_tokens = _int(body, "max_completion_tokens", None) or _int(body, "max_tokens", None)
    else:  # CompletionRequest: max_tokens defaults to 16 and must be positive
        max_tokens = _int(body, "max_tokens", 16)
        if not max_tokens:
            raise BadRequest("max_tokens must be positive")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object.")
    req, seed = emu.new_request(prompt, n_prompt, max_tokens, ignore_eos, temperature)

    def cached() -> int | None:
        return req.cached if emu.flags.get("enable_cache_report") else None

    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    model = json.dumps(body.get("model") or emu.model)
    obj = "chat.completion" if chat else "text_completion"
    legacy = emu.log.version != "0.5.23"  # 0.5.8.post1 / 0.5.9: protocol.py's older models
    if not body.get("stream"):
        await _drain(emu, req)
        text = emu.text(seed, 0, req.emitted)
        choice: dict[str, Any] = {"index": 0, "finish_reason": req.finish_reason,
                                  "matched_stop": tokens.EOS_ID if req.finish_reason == "stop" else None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        else:
            choice.update(text=text, logprobs=None)
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": json.loads(model),
                             "choices": [choice], "usage": _usage(n_prompt, req.emitted, legacy=legacy, cached=cached())})
    # The chunks as 0.5.23 serializes them (entrypoints/openai/): text chunks are pydantic models
    # (protocol.py CompletionStreamResponse / ChatCompletionStreamResponse: "usage": null unless
    # continuous_usage_stats); chat's role and finish chunks are sse_utils.py's msgspec structs
    # (no "usage" key; a delta of reasoning_content, role, content). A completion's last text
    # chunk carries the finish_reason (serving_completions.py:374); chat sends it in a chunk of
    # its own (serving_chat.py:2655). The usage chunk is dumped with exclude_none.
    # 0.5.9 and 0.5.8.post1 (`legacy`) dump every chat chunk with pydantic, usage chunk included
    # (serving_chat.py 0.5.9:679, :799, :857: model_dump_json() without exclude_none; DeltaMessage
    # role, content, reasoning_content, tool_calls; "usage": null in each); 0.5.8.post1's
    # completions have no continuous_usage_stats (serving_completions.py).
    chunk_obj = f"{obj}.chunk" if chat else obj
    head = f'data: {{"id":"{rid}","object":"{chunk_obj}","created":{created},"model":{model},"choices":['
    head_b = head.encode()
    if chat:
        open_b = b'{"index":0,"delta":{"role":null,"content":'
        close_b = b',"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":' if legacy \
            else b',"reasoning_content":null},"logprobs":null,"finish_reason":'
    else:
        open_b, close_b = b'{"index":0,"text":', b',"logprobs":null,"finish_reason":'
    end_b = b',"matched_stop":null}]'
    # a finish on EOS names it: FINISH_MATCHED_TOKEN's "matched" (schedule_batch.py) as matched_stop

    def finish_end() -> bytes:
        return b',"matched_stop":' + (str(tokens.EOS_ID).encode() if req.finish_reason == "stop" else b"null") + b"}]"
    # utils.py should_include_usage (0.5.23): --stream-response-default-include-usage adds the usage
    # chunk whether or not the request asks for it (0.5.9 has no such flag).
    include_usage = bool(stream_options.get("include_usage")) or bool(emu.flags.get("stream_response_default_include_usage"))
    # serving_completions.py:395 / serving_chat.py:3691 (0.5.23): the running usage in every chunk.
    continuous = bool(stream_options.get("continuous_usage_stats")) and (chat or emu.log.version != "0.5.8.post1")

    def usage_b(n: int, full: bool) -> bytes:
        # The running usage of a completion chunk carries no cached details (serving_completions.py:397);
        # chat's does, and so does the final usage chunk of both.
        details = cached() if chat or not full else None
        return json.dumps(_usage(n_prompt, n, exclude_none=not full, legacy=legacy, cached=details),
                          separators=(",", ":")).encode()

    async def events() -> AsyncIterator[bytes]:
        if chat and legacy:
            yield head_b + b'{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,' \
                           b'"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],' \
                           b'"usage":null}\n\n'
        elif chat:
            yield head_b + b'{"index":0,"delta":{"reasoning_content":null,"role":"assistant","content":""},' \
                           b'"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
        sent, finished = 0, False
        async for n in emu.run(req):
            text = json.dumps(emu.text(seed, sent, n)).encode()
            sent = n
            finished = not chat and req.state == "done" and n >= req.target
            finish = json.dumps(req.finish_reason).encode() if finished else b"null"
            usage = usage_b(n, True) if continuous else b"null"
            yield head_b + open_b + text + close_b + finish + (finish_end() if finished else end_b) \
                + b',"usage":' + usage + b"}\n\n"
        if chat and legacy:
            yield head_b + b'{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,' \
                b'"tool_calls":null},"logprobs":null,"finish_reason":' + json.dumps(req.finish_reason).encode() \
                + finish_end() + b',"usage":null}\n\n'
        elif chat:
            yield head_b + b'{"index":0,"delta":{"reasoning_content":null},"logprobs":null,"finish_reason":' \
                + json.dumps(req.finish_reason).encode() + finish_end() + b"}\n\n"
        elif not finished:  # no token came after the last chunk: the finish rides an empty one
            usage = usage_b(sent, True) if continuous else b"null"
            yield head_b + open_b + b'""' + close_b + json.dumps(req.finish_reason).encode() + finish_end() \
                + b',"usage":' + usage + b"}\n\n"
        if include_usage:
            yield head[:-len('"choices":[')].encode() + b'"choices":[],"usage":' \
                + usage_b(req.emitted, chat and legacy) + b"}\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _histogram(name: str, values: list[float]) -> list[str]:
    lines = [f"# TYPE sglang:{name} histogram"]
    for le in _BUCKETS:
        label = "+Inf" if le == float("inf") else repr(le)
        lines.append(f'sglang:{name}_bucket{{le="{label}"}} {sum(1 for v in values if v <= le)}')
    lines += [f"sglang:{name}_sum {sum(values)}", f"sglang:{name}_count {len(values)}"]
    return lines


def _metrics(emu: Emulator) -> str:
    s = emu.scheduler
    st = s.stats
    lines = [
        "# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs {s.num_running}",
        "# TYPE sglang:num_queue_reqs gauge", f"sglang:num_queue_reqs {len(s.queue)}",
        "# TYPE sglang:token_usage gauge", f"sglang:token_usage {s.token_usage()}",
        "# TYPE sglang:gen_throughput gauge", f"sglang:gen_throughput {st.last_gen_throughput}",
        "# TYPE sglang:cache_hit_rate gauge", "sglang:cache_hit_rate 0.0",
        "# TYPE sglang:prompt_tokens_total counter", f"sglang:prompt_tokens_total {st.prompt_tokens}",
        "# TYPE sglang:generation_tokens_total counter", f"sglang:generation_tokens_total {st.generation_tokens}",
        "# TYPE sglang:num_requests_total counter", f"sglang:num_requests_total {st.requests}",
    ]
    lines += _histogram("time_to_first_token_seconds", st.ttft)
    lines += _histogram("inter_token_latency_seconds", st.itl)
    lines += _histogram("e2e_request_latency_seconds", st.e2e)
    return "\n".join(lines) + "\n"


def _log_config(log: Logger) -> dict[str, Any]:
    """uvicorn's config with the version's formats (templates.yaml `uvicorn_format`); the access
    log stays on while serving, as SGLang leaves it."""
    fmt = {"datefmt": "%Y-%m-%d %H:%M:%S", "use_colors": False}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": log.words["uvicorn_format"],
                                       **fmt},
                           "access": {"()": "uvicorn.logging.AccessFormatter",
                                      "fmt": log.words["uvicorn_access_format"], **fmt}},
            "handlers": {"default": {"formatter": "default", "class": "logging.StreamHandler",
                                     "stream": "ext://sys.stderr"},
                         "access": {"formatter": "access", "class": "logging.StreamHandler",
                                    "stream": "ext://sys.stdout"}},
            "loggers": {"uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
                        "uvicorn.error": {"level": "INFO"},
                        "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False}}}


async def _warmup(emu: Emulator, ranks: Any, base: str, server: uvicorn.Server, time_scale: float) -> None:
    """SGLang's own warmup: GET /model_info, one 8-token POST /generate, then ready.

    SGLang's warmup thread starts with the app and tries /model_info once a second (120 tries);
    uvicorn binds within milliseconds, so the first try answers. The time scale shrinks that
    second below what a loaded machine takes to bind, so the first try here waits for uvicorn's
    own `started` instead; a bind that fails is played out by `_warmup_failed`.
    """
    while not server.started:
        await asyncio.sleep(0.01)
    if emu.plan.get("skip_server_warmup"):
        # http_server.py _wait_and_warmup (0.5.23:2589, 0.5.9:1829): no warmup request, the server
        # is Up at once; the forward it would have run (and its failure) comes with the first request.
        emu.ready = True
        emu.on_first_request = lambda: _first_forward(emu, ranks)
        if emu.log.version == "0.5.23":
            async with httpx.AsyncClient(base_url=base, timeout=None) as client:
                await client.post("/freeze_gc")
        emu.log.say("ready")
        return
    await asyncio.sleep(time_scale)
    async with httpx.AsyncClient(base_url=base, timeout=None) as client:
        await client.get("/model_info")
        # The warmup /generate starts the tokenizer manager's loop, whose SIGQUIT handler
        # replaces the launch-phase one: a rank failing from here on gets the running wording.
        ranks.sigquit_line = "sigquit_running"
        ranks.send("warmup")
        if emu.plan["hang"] == "warmup" or (emu.plan["failure"] and emu.plan["failure"]["phase"] == "warmup"):
            await asyncio.Event().wait()  # stuck forever, or the rank crashes and SIGQUITs us
        await client.post("/generate", json={"text": _WARMUP_PROMPT,
                                             "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
        emu.ready = True  # /health answers 503 until the warmup request has succeeded
        if emu.log.version == "0.5.23":  # _freeze_gc_after_server_warmup (http_server.py:2597)
            await client.post("/freeze_gc")
    emu.log.say("ready")


def _first_forward(emu: Emulator, ranks: Any) -> None:
    """Under --skip-server-warmup the first request runs the forward the warmup would have: a
    landscape's warmup failure strikes there (the rank crashes and SIGQUITs us), a hang stops
    decoding."""
    ranks.sigquit_line = "sigquit_running"
    ranks.send("warmup")
    if emu.plan["hang"] == "warmup":
        emu.scheduler.freeze()


def _warmup_failed(log: Logger, ranks: Any, host: str, port: int, time_scale: float) -> None:
    """uvicorn could not bind (the port is taken). SGLang's lifespan shutdown joins the warmup
    thread, whose 120 tries at /model_info are refused; it logs that and kills its process tree,
    itself included (kill_process_tree: SIGKILL), so uvicorn's shutdown never completes."""
    time.sleep(_WARMUP_TRIES * time_scale)
    log.say("warmup_failed", traceback=log.traceback("warmup_poll", (
        f"requests.exceptions.ConnectionError: HTTPConnectionPool(host='{host}', port={port}): Max retries exceeded "
        "with url: /model_info (Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at "
        "0x7f3a2c1e5f90>: Failed to establish a new connection: [Errno 111] Connection refused'))")))
    ranks.kill_tree()


async def _watch_ranks(emu: Emulator, ranks: Any, settings: Settings) -> None:
    """What SGLang does when a rank dies (killed from outside) while serving.

    0.5.23's SubprocessWatchdog polls the schedulers every second and SIGQUITs the main process.
    Earlier versions have none: the other ranks wait in a collective, so decoding stops, until a
    surviving rank's scheduler watchdog sees a batch stuck for --watchdog-timeout seconds, logs
    it, waits 5 s for the parent to print, and SIGQUITs it. Idle, nothing happens.
    """
    while True:
        await asyncio.sleep(1.0)
        dead = [rank for rank, proc in enumerate(ranks.procs) if proc.poll() is not None]
        if dead:
            break
    proc = ranks.procs[dead[0]]
    if emu.log.words.get("child_crashed"):
        emu.log.say("child_crashed", rank=dead[0], pid=proc.pid, code=proc.returncode)
        os.kill(os.getpid(), signal.SIGQUIT)
        return
    emu.scheduler.freeze()
    survivors = [rank for rank in range(len(ranks.procs)) if rank not in dead]
    if not survivors:
        return
    while not emu.scheduler.num_running:
        await asyncio.sleep(0.05)
    timeout = float(emu.flags.get("watchdog_timeout") or 300)
    await asyncio.sleep(timeout * settings.time_scale)
    Logger(settings.version, survivors[0], emu.plan["log_ms"]).say("watchdog", timeout=emu.flags.get(
        "watchdog_timeout") or 300)
    await asyncio.sleep(5 * settings.time_scale)
    os.kill(os.getpid(), signal.SIGQUIT)


async def _report_load(emu: Emulator, ranks: Any) -> None:
    while True:
        await asyncio.sleep(1.0)
        ranks.send(f"load {len(emu.scheduler.running)} {emu.scheduler.current_rate():.1f}")


def serve(flags: dict[str, Any], env: dict[str, str], plan: dict[str, Any], landscape: Landscape,
          settings: Settings, ranks: Any, log: Logger) -> None:
    """Run uvicorn until SIGTERM/SIGINT; warmup and the ticker start with the app."""
    emu = Emulator(flags, env, plan, landscape, settings, log)
    host, port = flags.get("host") or "127.0.0.1", int(flags.get("port") or 30000)
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://{url_host}:{port}"
    background: list[asyncio.Task[None]] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        emu.scheduler.start()
        loop = asyncio.get_running_loop()
        background.append(loop.create_task(_report_load(emu, ranks)))
        background.append(loop.create_task(_watch_ranks(emu, ranks, settings)))
        background.append(loop.create_task(_warmup(emu, ranks, base, server, settings.time_scale)))
        yield
        if not server.started:  # the bind failed; SGLang's lifespan joins the warmup thread here
            _warmup_failed(log, ranks, url_host, port, settings.time_scale)

    config = uvicorn.Config(build_app(emu, lifespan), host=host, port=port, log_config=_log_config(log),
                            loop="uvloop", http="httptools", timeout_keep_alive=5, lifespan="on")
    server = uvicorn.Server(config)
    server.run()
