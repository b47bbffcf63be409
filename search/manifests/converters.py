"""SGLang's `type=` converters, rebuilt so a manifest parser converts and rejects values as
the real one does.

Each function keeps the original's ``__name__``: argparse names it in messages such as
``argument --x: invalid loads value: 'y'``. Error texts are SGLang's own.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

Converter = Callable[[str], Any]


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def nullable_str(val: str) -> str | None:
    if not val or val == "None":
        return None
    return val


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(value: str) -> int:
    """Integers with SI (1k, 25.6k) or IEC (1Ki) suffixes, case-sensitive."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def parse_cuda_graph_backend_arg(raw: str) -> str:
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return raw


def _cuda_graph_config(allowed_keys: dict[str, list[str]]) -> Converter:
    """`--cuda-graph-config` JSON: phase -> settings, keys checked per phase."""
    phases = tuple(allowed_keys)

    def parse_cuda_graph_config_arg(raw: str) -> dict[str, dict[str, Any]]:
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
            )
        result: dict[str, dict[str, Any]] = {}
        for phase, settings in parsed.items():
            phase = str(phase)
            if phase not in phases:
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config: unknown phase '{phase}', expected one of {phases}"
                )
            if not isinstance(settings, dict):
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config['{phase}'] must be a JSON object, got "
                    f"{type(settings).__name__}"
                )
            if "backend" in settings:
                parse_cuda_graph_backend_arg(settings["backend"])
            allowed = tuple(allowed_keys[phase])
            for key in settings:
                if key not in allowed:
                    raise argparse.ArgumentTypeError(
                        f"--cuda-graph-config['{phase}']: unknown key '{key}', expected one of {allowed}"
                    )
            result[phase] = dict(settings)
        return result

    return parse_cuda_graph_config_arg


def _passthrough(name: str) -> Converter:
    """A converter this release of `search` cannot rebuild: accept the string unchanged."""

    def convert(value: str) -> str:
        return value

    convert.__name__ = name.rsplit(".", 1)[-1]
    return convert


_SIMPLE: dict[str, Converter] = {
    "int": int,
    "float": float,
    "str": str,
    "json": json.loads,
    "json_list": json_list_type,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "cuda_graph_backend": parse_cuda_graph_backend_arg,
}


def converter(name: str | None, data: dict[str, Any]) -> Converter | None:
    """The callable for a manifest's converter name; `data` is the manifest's `converters`."""
    if name is None:
        return None
    if name in _SIMPLE:
        return _SIMPLE[name]
    if name == "cuda_graph_config" and name in data:
        return _cuda_graph_config(data[name])
    return _passthrough(name)
