"""The emulator's own settings, read from `SEARCH_EMULATOR_*` environment variables.

They live in the environment (not in flags) because the emulator must accept exactly SGLang's
flags, and because rank processes inherit them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_VERSION = "0.5.23"


@dataclass(frozen=True)
class Settings:
    version: str
    state_dir: Path
    time_scale: float
    landscape: Path | None  # None: the built-in seed landscape
    noise: float  # relative standard deviation of the served rate
    seed: int | None
    gpus: int  # GPUs on the emulated host

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        e = os.environ if env is None else env
        landscape = e.get("SEARCH_EMULATOR_LANDSCAPE")
        seed = e.get("SEARCH_EMULATOR_SEED")
        return cls(
            version=e.get("SEARCH_EMULATOR_SGLANG_VERSION") or DEFAULT_VERSION,
            state_dir=Path(e.get("SEARCH_EMULATOR_STATE_DIR") or f"/tmp/search-emulator-{os.getuid()}"),
            time_scale=_number(e, "SEARCH_EMULATOR_TIME_SCALE", 1.0),
            landscape=Path(landscape) if landscape else None,
            noise=_number(e, "SEARCH_EMULATOR_NOISE", 0.0),
            seed=int(seed) if seed else None,
            gpus=int(_number(e, "SEARCH_EMULATOR_GPUS", 8)),
        )


def _number(env: os._Environ[str] | dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"error: {name}={raw!r} is not a number; set it to e.g. 0.01 or unset it") from None
    if value < 0:
        raise SystemExit(f"error: {name}={raw!r} must not be negative")
    return value
