"""A stand-in space with the shape of spaces/glm5-nvfp4-8gpu.yaml (six parameters, one conditional),
written against the `Space.suggest` contract, and its config -> landscape flags conversion.
"""

from __future__ import annotations

from typing import Any

import optuna

BACKENDS = ["auto", "triton", "cutlass", "flashinfer_cutlass", "flashinfer_trtllm"]
LADDER = [64, 256, 512, 1024]


class FixtureSpace:
    """Six searched parameters; the graph batch-size cap applies only while graphs are on."""

    baseline: dict[str, Any] = {
        "--max-running-requests": 64, "--disable-cuda-graph": False, "--cuda-graph-max-bs-decode": 128,
        "--moe-runner-backend": "flashinfer_cutlass", "--mem-fraction-static": 0.88, "NCCL_MIN_NCHANNELS": 4,
    }
    targets: dict[int, float] = {64: 300.0}

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        config: dict[str, Any] = {
            "--max-running-requests": trial.suggest_int("--max-running-requests", 32, 2048, log=True),
            "--disable-cuda-graph": trial.suggest_categorical("--disable-cuda-graph", [False, True]),
        }
        if not config["--disable-cuda-graph"]:
            config["--cuda-graph-max-bs-decode"] = trial.suggest_int("--cuda-graph-max-bs-decode", 32, 1024, log=True)
        config["--moe-runner-backend"] = trial.suggest_categorical("--moe-runner-backend", BACKENDS)
        config["--mem-fraction-static"] = trial.suggest_float("--mem-fraction-static", 0.80, 0.95, step=0.01)
        config["NCCL_MIN_NCHANNELS"] = trial.suggest_int("NCCL_MIN_NCHANNELS", 1, 32, log=True)
        return config


def to_flags(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Flags by argparse dest (defaults filled for the ones this space touches) and the environment."""
    flags: dict[str, Any] = {"max_running_requests": None, "disable_cuda_graph": False,
                             "cuda_graph_max_bs_decode": None, "moe_runner_backend": "auto",
                             "mem_fraction_static": None, "cuda_graph_backend_decode": "full"}
    env: dict[str, str] = {}
    for name, value in config.items():
        if name.startswith("--"):
            flags[name[2:].replace("-", "_")] = value
        else:
            env[name] = str(value)
    return flags, env
