"""The main process: parse flags, plan the startup from the landscape, start the ranks, serve.

Mirrors SGLang's launch: the main process logs `server_args=...`, spawns one scheduler per TP
rank, waits for all to report ready, then runs the HTTP server and the warmup request. A child
that fails sends SIGQUIT; the main process then logs SGLang's line and kills its process tree.
"""

from __future__ import annotations

import json
import logging
import os
import select
import zlib
import signal
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from search import manifests
from search.emulator import cuda_graphs, gpu_state
from search.emulator.config import Settings
from search.emulator.gpu_state import TOTAL_MIB
from search.emulator.landscape import Landscape, LandscapeError
from search.emulator.logs import Logger

# The built-in model: GLM-5-NVFP4 as the seed ran it.
MODEL = {"shards": 83, "arch": "GlmMoeDsaForCausalLM", "weights_gib_total": 215.0, "context_len": 202752,
         "kv_mib_per_token": 1 / 16, "quantization": "modelopt_fp4"}
GPU_GIB = TOTAL_MIB / 1024
# SGLang 0.5.8/0.5.9 autotune only these MoE runners; 0.5.23 added the rest.
_AUTOTUNE_0_5_9 = {"flashinfer_trtllm", "flashinfer_mxfp4"}
_AUTOTUNE_0_5_23 = _AUTOTUNE_0_5_9 | {"flashinfer_trtllm_routed", "flashinfer_cutedsl", "flashinfer_cutlass",
                                      "flashinfer_megamoe"}
# SGLang's default decode capture sizes, cut at --cuda-graph-max-bs (default 256 here).
_CAPTURE_BS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# Prefill token counts 0.5.23 captures, cut at --chunked-prefill-size (the real list is
# prefill_config.bs, resolved from the model; these are the emulator's stand-in).
_PREFILL_CAPTURE_TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384)
# Environment variables SGLang renames at import (environ.py `_convert_SGL_to_SGLANG`): the old
# name's value is copied verbatim (not negated) onto the new one, in the versions that do it.
_RENAMED_ENV = {"0.5.8.post1": {"SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK": "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"},
                "0.5.9": {"SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK": "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"}}
# environ.py EnvBool (0.5.23: line 145): these words, any case; any other value keeps the default.
_ENV_TRUE, _ENV_FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")
# 0.5.23 also autotunes the FP4 GEMM of a modelopt_fp4 model (flashinfer_autotune.py:135); its
# `auto` backend is flashinfer_cutlass on the emulated SM120 GPUs (fp4_utils.py:154).
_FP4_QUANTIZATIONS = ("modelopt_fp4", "modelopt_mixed")
_FP4_AUTOTUNED_GEMMS = ("auto", "flashinfer_cutlass", "flashinfer_cutedsl")


def env_bool(env: dict[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").lower()
    return True if value in _ENV_TRUE else False if value in _ENV_FALSE else default


def fp4_gemm_autotunes(flags: dict[str, Any]) -> bool:
    quantization = flags.get("quantization") or MODEL["quantization"]
    return quantization in _FP4_QUANTIZATIONS and flags.get("fp4_gemm_runner_backend") in _FP4_AUTOTUNED_GEMMS


def nan_warning(version: str, flags: dict[str, Any], env: dict[str, str]) -> str | None:
    """How the version reports NaN logits: "every_step" (up to 0.5.9 with --enable-nan-detection:
    layers/sampler.py warns at each sampling step), "once" (0.5.23 with SGLANG_SANITIZE_NAN_LOGITS:
    utils/async_probe.py sanitizes and warns once), else None (nothing is logged; NaN flows on).
    0.5.23's SGLANG_ENABLE_NAN_LOGITS_CHECK / SGLANG_ENABLE_ASYNC_ASSERT turn the warning into a
    device-side assert, which the emulator does not play (None)."""
    if "enable_nan_detection" in flags:  # the flag exists up to 0.5.9
        return "every_step" if flags["enable_nan_detection"] else None
    asserts = env_bool(env, "SGLANG_ENABLE_NAN_LOGITS_CHECK", False) or env_bool(env, "SGLANG_ENABLE_ASYNC_ASSERT", False)
    return "once" if env_bool(env, "SGLANG_SANITIZE_NAN_LOGITS", False) and not asserts else None


def multithread_load(version: str, flags: dict[str, Any]) -> bool:
    """--model-loader-extra-config's `enable_multithread_load`: the default loader of 0.5.23 is the
    multi-thread one (model_loader/loader.py:613), of 0.5.9 and 0.5.8.post1 the one-file-at-a-time
    one (loader.py:479 / :506). A value that is not a JSON object keeps the default here (SGLang
    would refuse it at load)."""
    default = version not in ("0.5.8.post1", "0.5.9")
    try:
        extra = json.loads(flags.get("model_loader_extra_config") or "{}")
    except ValueError:
        return default
    return bool(extra.get("enable_multithread_load", default)) if isinstance(extra, dict) else default


def parse_flags(version: str, argv: list[str], deprecations: list[str] | None = None) -> dict[str, Any]:
    """Every dest of the version's parser; argparse itself prints usage/errors and exits 2.

    A `--config FILE.yaml` is inlined first, as SGLang's `prepare_server_args` does; a bad file
    fails as SGLang's ValueError does (exit 1). The deprecation warnings of SGLang's actions are
    appended to `deprecations` (printed by `print_deprecations`), not logged.
    """
    manifest = manifests.load(version)
    try:
        argv = manifest.expand_config(argv)
    except manifests.ManifestError as exc:
        print(f"ValueError: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    parser = manifest.parser()
    quiet = logging.getLogger(manifests.__name__)
    was = quiet.disabled
    quiet.disabled = True  # the manifest's parser would log them plainly
    try:
        flags = vars(parser.parse_args(argv))
    finally:
        quiet.disabled = was
    if deprecations is not None:
        deprecations += getattr(parser, "warnings", [])
    return flags


# 0.5.23 words these retired flags in its post-parse hooks (arg_groups/serving_hook.py), uncoloured,
# when the flag it points to is not given too; the others go through print_deprecated_warning.
_HOOK_DEPRECATIONS = {"--enable-flashinfer-allreduce-fusion": ("deprecated_allreduce_fusion",
                                                               "flashinfer_allreduce_fusion_backend"),
                      "--grpc-mode": ("deprecated_grpc_mode", "smg_grpc_mode"),
                      "--disable-fast-image-processor": ("deprecated_image_processor", None)}


def print_deprecations(log: Logger, flags: dict[str, Any], messages: list[str]) -> None:
    """The warnings of retired flags as the version logs them (templates.yaml `deprecated*`)."""
    for message in messages:
        option = message.split(" ", 1)[0]
        hook = _HOOK_DEPRECATIONS.get(option) if "deprecated_allreduce_fusion" in log.words else None
        if hook is None:
            log.warn_at("deprecated", message=message)
        elif hook[1] is None or not flags.get(hook[1]):
            log.warn_at(hook[0])


def tp_size(flags: dict[str, Any]) -> int:
    """`--tp-size`'s dest is `tensor_parallel_size` before 0.5.23 (argparse takes the first option)."""
    return int(flags.get("tp_size") or flags.get("tensor_parallel_size") or 1)


def world_size(flags: dict[str, Any]) -> int:
    """GPUs (ranks) the server starts: dp x tp x pp, attention DP running inside the TP group.

    As SGLang counts them: sglang-0.5.23 srt/server_args.py:581-589 (compute_world_size), with
    ``--dp-size N --enable-dp-attention`` read as ``--attn-dp-size N`` (srt/arg_groups/parallel_hook.py:50-61);
    sglang-0.5.9 srt/managers/data_parallel_controller.py:246 (one tp x pp group per replica).
    """
    dp = int(flags.get("dp_size") or flags.get("data_parallel_size") or 1)
    pp = int(flags.get("pp_size") or flags.get("pipeline_parallel_size") or 1)
    attention_dp = int(flags.get("attn_dp_size") or 1) > 1 or bool(flags.get("enable_dp_attention"))
    return (1 if attention_dp else dp) * tp_size(flags) * pp


def balance_check(version: str, env: dict[str, str]) -> bool:
    """`envs.SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK.get()`: default True; a value that is not a
    boolean word also reads as the default (SGLang warns and falls back)."""
    env = dict(env)
    for old, new in _RENAMED_ENV.get(version, {}).items():
        if old in env:
            env[new] = env[old]
    return env_bool(env, "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", True)


def plan(settings: Settings, flags: dict[str, Any], env: dict[str, str], landscape: Landscape) -> dict[str, Any]:
    """Everything the ranks and the server need, decided once from flags, env and landscape."""
    outcome = landscape.startup(flags, env)
    graphs = cuda_graphs.on(flags)
    if outcome and outcome["phase"] == "cuda_graph" and not graphs:
        raise LandscapeError(
            f"landscape {landscape.path}: startup() puts a {'hang' if outcome.get('hang') else 'crash'} in phase "
            "'cuda_graph', but these flags turn decode CUDA graphs off, so SGLang never captures; have startup() "
            "check the graph flags (search.emulator.cuda_graphs.on(flags)) and name a phase that runs")
    seconds, explicit_autotune = landscape.phase_seconds(flags, env)
    if explicit_autotune is not None:
        autotune = explicit_autotune > 0
    else:
        autotune = not flags.get("disable_flashinfer_autotune") and (
            flags.get("moe_runner_backend") in (_AUTOTUNE_0_5_23 if settings.version == "0.5.23" else _AUTOTUNE_0_5_9)
            or (settings.version == "0.5.23" and fp4_gemm_autotunes(flags)))
    if outcome and outcome["phase"] == "autotune":
        autotune = True  # a crash or hang there means it ran
    tp = tp_size(flags)
    weights = MODEL["weights_gib_total"] / tp
    fraction = float(flags.get("mem_fraction_static") or 0.85)
    pool = max(fraction * GPU_GIB, weights + 0.5)
    kv_tokens = int((pool - weights) * 1024 / MODEL["kv_mib_per_token"])
    mrr = int(flags.get("max_running_requests") or landscape.max_running_requests(flags, env))
    # SGLang never captures a batch larger than the request pool (--max-running-requests).
    capture = cuda_graphs.decode_bs(flags) or [b for b in _CAPTURE_BS
                                               if b <= (cuda_graphs.decode_max_bs(flags) or 256)]
    return {
        "version": settings.version, "state_dir": str(settings.state_dir), "host_gpus": settings.gpus,
        "log_ms": env_bool(env, "SGLANG_LOG_MS", False),
        "seconds": {k: v * settings.time_scale for k, v in seconds.items()},
        "failure": outcome if outcome and not outcome.get("hang") else None,
        "hang": outcome["phase"] if outcome and outcome.get("hang") else None,
        "tp": tp, "failing_ranks": failing_ranks(outcome, flags, tp), "autotune": autotune, "cuda_graph": graphs,
        "graph_backend": cuda_graphs.backend(flags, "decode"), "prefill_graph": cuda_graphs.on(flags, "prefill"),
        "prefill_graph_backend": cuda_graphs.backend(flags, "prefill"),
        "prefill_graph_tokens": [n for n in _PREFILL_CAPTURE_TOKENS if n <= int(flags.get("chunked_prefill_size") or 8192)],
        "quantization": flags.get("quantization") or MODEL["quantization"],
        "balance_check": balance_check(settings.version, env), "base_gpu_id": int(flags.get("base_gpu_id") or 0),
        "autotune_cache": "/root/.cache/sglang/flashinfer/autotune/0.6.1/sm120/5f0c7a2e9d41b3c8",
        "shards_desc": "shards_desc" if multithread_load(settings.version, flags) == (settings.version not in (
            "0.5.8.post1", "0.5.9")) else "shards_desc_other",
        "skip_server_warmup": bool(flags.get("skip_server_warmup")),
        "shards": MODEL["shards"], "arch": MODEL["arch"], "gpu_gib": GPU_GIB, "weights_gib": weights,
        "pool_gib": pool, "kv_tokens": kv_tokens, "max_running_requests": mrr,
        "chunked_prefill_size": flags.get("chunked_prefill_size") or 8192,
        "max_prefill_tokens": flags.get("max_prefill_tokens") or 16384,
        "context_len": flags.get("context_length") or MODEL["context_len"],
        "graph_bs": [b for b in capture if b <= mrr],
        "corrupt": landscape.corrupt(flags, env),
        "nan_warning": nan_warning(settings.version, flags, env) if landscape.corrupt(flags, env) else None,
    }


def failing_ranks(outcome: dict[str, Any] | None, flags: dict[str, Any], tp: int) -> list[int]:
    """Which ranks raise the landscape's error.

    Out-of-memory hits every rank alike (each holds the same shard sizes); any other error is
    raised by one rank, picked from the flags so a config always fails the same way but not
    always on TP0 (real reports show e.g. TP2's traceback).
    """
    if not outcome or outcome.get("hang"):
        return []
    error = outcome["error"].lower()
    if "out of memory" in error or "not enough memory" in error:
        return list(range(tp))
    return [zlib.crc32(repr(sorted(flags.items(), key=str)).encode()) % tp]


def gpus_of(flags: dict[str, Any], env: dict[str, str]) -> list[int]:
    """One GPU per rank: CUDA_VISIBLE_DEVICES from --base-gpu-id on, else base.. (servers on disjoint lists
    run side by side: each GPU's state file is its own)."""
    tp = world_size(flags)
    visible = [int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip().isdigit()]
    base = int(flags.get("base_gpu_id") or 0)
    return [visible[base + r] if base + r < len(visible) else 10_000 + r for r in range(tp)] if visible \
        else [base + r for r in range(tp)]


class Ranks:
    """The rank children: start them, wait for ready, feed them load, end them."""

    def __init__(self) -> None:
        self.sigquit_line = "sigquit"  # the main process's handler; "sigquit_running" once serving
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ready_fds: list[int] = []

    def start(self, the_plan: dict[str, Any], gpus: list[int]) -> None:
        """One child a rank. Called once the main process's handlers are in place: a SIGTERM that came
        while they were spawned killed the main process alone and left its ranks running."""
        for rank, gpu in enumerate(gpus):
            r, w = os.pipe()
            proc = subprocess.Popen([sys.executable, "-m", "search.emulator.ranks"], stdin=subprocess.PIPE,
                                    pass_fds=(w,), start_new_session=False)
            os.close(w)
            assert proc.stdin is not None
            proc.stdin.write((json.dumps({**the_plan, "rank": rank, "gpu": gpu, "ready_fd": w}) + "\n").encode())
            proc.stdin.flush()
            self.procs.append(proc)
            self.ready_fds.append(r)

    def wait_ready(self) -> int | None:
        """Block until every rank said ready: None; or the first rank that died without a word.

        On the way each rank says `init` where SGLang's init_torch_distributed runs its collectives
        (rendezvous, the all-reduce of free memory); all get `go` once all are there, so no rank
        gets past that point alone. A failing rank SIGQUITs us instead; a hang waits forever. A
        rank killed from outside closes its pipe unannounced, which SGLang reports as a dead
        scheduler.
        """
        pending, arrived = set(self.ready_fds), set()
        while pending:
            readable, _, _ = select.select(list(pending), [], [])
            for fd in readable:
                words = os.read(fd, 64).split()
                if not words:
                    return self.ready_fds.index(fd)
                if b"init" in words:
                    arrived.add(fd)
                    if len(arrived) == len(self.ready_fds):
                        self.send("go")
                if b"ready" in words:
                    pending.discard(fd)
        return None

    def send(self, line: str) -> None:
        for proc in self.procs:
            try:
                assert proc.stdin is not None
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def kill(self, sig: int = signal.SIGKILL) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    def kill_tree(self) -> None:
        """SGLang's kill_process_tree(os.getpid()): SIGKILL the ranks, then this process."""
        self.kill()
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    settings = Settings.from_env()
    deprecations: list[str] = []
    try:
        flags = parse_flags(settings.version, argv, deprecations)
    except SystemExit as exc:
        return int(exc.code or 0)
    env = dict(os.environ)
    try:
        landscape = Landscape.load(settings.landscape)
        the_plan = plan(settings, flags, env, landscape)
    except LandscapeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log = Logger(settings.version, None, the_plan["log_ms"])
    print_deprecations(log, flags, deprecations)
    log.raw("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in flags.items()) + ")")
    gpus = gpus_of(flags, env)
    the_plan["occupants"] = [asdict(o) if o else None for o in
                             (gpu_state.occupant(settings.state_dir, g) if g < settings.gpus else None for g in gpus)]
    ranks = Ranks()

    def on_sigquit(signum: int, frame: object) -> None:
        log.say(ranks.sigquit_line)
        ranks.kill_tree()

    def on_sigterm(signum: int, frame: object) -> None:
        ranks.kill(signal.SIGTERM)
        for proc in ranks.procs:
            proc.wait()
        os._exit(0)

    signal.signal(signal.SIGQUIT, on_sigquit)
    signal.signal(signal.SIGTERM, on_sigterm)
    ranks.start(the_plan, gpus)
    dead = ranks.wait_ready()
    if dead is not None:
        return died_in_init(log, ranks, dead)
    from search.emulator.server import serve  # Starlette/uvicorn import only once the ranks are up

    serve(flags, env, the_plan, landscape, settings, ranks, log)
    ranks.kill(signal.SIGTERM)
    return 0


def died_in_init(log: Logger, ranks: Ranks, rank: int) -> int:
    """A rank killed before it was ready: SGLang's `_wait_for_scheduler_ready` wording, exit 1."""
    code = ranks.procs[rank].wait()
    log.say("init_dead", rank=rank)
    log.say("init_dead_code", code=code)
    error = log.words.get("init_died")
    error = f"RuntimeError: {error.format(rank=rank, code=code)}" if error else "EOFError"
    frame = ('  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/entrypoints/engine.py", line 2029, '
             'in _wait_for_scheduler_ready\n    raise _scheduler_died_error(i, scheduler_procs[i])\n')
    print(f"Traceback (most recent call last):\n{frame}{error}", file=sys.stderr, flush=True)
    ranks.kill()
    return 1
