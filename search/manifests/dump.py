"""Print SGLang's `launch_server` command line as a JSON manifest.

Standalone on purpose (stdlib + sglang only): it runs inside the *target's* Python, locally
or over SSH as `python - < dump.py`, so it must not import `search`. It builds the real
parser with `ServerArgs.add_cli_args` (never `ServerArgs(...)`, which probes GPUs and models)
and describes every action so `search.manifests` can rebuild an equivalent parser.

Output: {"version", "flags": [...], "converters": {...}} on stdout; exit 3 with a one-line
message on stderr when sglang cannot be imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
from typing import Any

# Converter functions SGLang passes as `type=`, by qualified name -> the name the loader
# rebuilds. A converter not listed here is recorded by its qualified name.
CONVERTERS = {
    "builtins.int": "int",
    "builtins.float": "float",
    "builtins.str": "str",
    "json.loads": "json",
    "sglang.srt.utils.common.json_list_type": "json_list",
    "sglang.srt.utils.common.human_readable_int": "human_readable_int",
    "sglang.srt.utils.common.nullable_str": "nullable_str",
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": "cuda_graph_backend",
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": "cuda_graph_config",
}

# Action classes by name -> manifest kind. SGLang's own actions are matched by class name
# because they moved modules between releases (server_args -> arg_groups.argparse_actions).
KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_ExtendAction": "extend",
    "BooleanOptionalAction": "boolean_optional",
    "LoRAPathAction": "lora_path",
    "DeprecatedAction": "deprecated",
    "DeprecatedStoreTrueAction": "deprecated_store_true",
    "DeprecatedStoreConstAction": "deprecated_store_const",
    "DeprecatedAliasStoreAction": "deprecated_alias",
}

# Help texts that retire a flag: "Deprecated. Use X instead.", "(Deprecated: use X)",
# "(Deprecated, use X)", "... is deprecated now. Please use X instead."
_DEPRECATED_HELP = re.compile(r"^\(?deprecated\b|\bis deprecated now\b", re.IGNORECASE)
_REPLACEMENT = re.compile(r"\b[Uu]se\s+(?:the\s+)?(?:'|`)?(-[^\s'`),]+(?:\s+<[^>]+>)?)")


def _json_safe(value: Any) -> Any:
    """Defaults and choices as JSON: tuples become lists, other objects their repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return repr(value)


def _choices(choices: Any) -> list[Any] | None:
    """Choices as a list; a set (its order changes per process) is sorted to keep files stable."""
    if choices is None:
        return None
    if isinstance(choices, (set, frozenset)):
        choices = sorted(choices, key=repr)
    return [_json_safe(c) for c in choices]


def _converter(fn: Any) -> str | None:
    if fn is None:
        return None
    qualified = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    return CONVERTERS.get(qualified, qualified)


def _kind(action: argparse.Action) -> str:
    for cls in type(action).__mro__:
        if cls.__name__ in KINDS:
            return KINDS[cls.__name__]
    return f"unknown:{type(action).__module__}.{type(action).__qualname__}"


def _replacement(action: argparse.Action) -> str | None:
    """What a retired flag names instead: the action's `new_flag`, else its help text."""
    new_flag = getattr(action, "new_flag", None)
    if new_flag:
        return str(new_flag)
    match = _REPLACEMENT.search(action.help or "")
    return match.group(1).rstrip(".") if match else None


def describe(action: argparse.Action) -> dict[str, Any]:
    """One flag as plain data; every field the loader needs to rebuild the action."""
    kind = _kind(action)
    help_text = action.help if isinstance(action.help, str) else ""
    deprecated = kind.startswith("deprecated") or bool(_DEPRECATED_HELP.search(help_text))
    return {
        "options": list(action.option_strings),
        "dest": action.dest,
        "kind": kind,
        "nargs": action.nargs,
        "type": _converter(action.type),
        "default": _json_safe(action.default),
        "choices": _choices(action.choices),
        "const": _json_safe(action.const),
        "const_value": _json_safe(getattr(action, "const_value", None)),
        "required": bool(action.required),
        "metavar": _json_safe(action.metavar),
        "deprecated": deprecated,
        "replacement": _replacement(action) if deprecated else None,
        "new_flag": getattr(action, "new_flag", None),
        "error_message": getattr(action, "error_message", None),
        "help": "==SUPPRESS==" if action.help == argparse.SUPPRESS else help_text,
    }


def _converter_data() -> dict[str, Any]:
    """Data some converters validate against, read from the installed SGLang."""
    try:
        from sglang.srt.model_executor import cuda_graph_config as cg
    except ImportError:
        return {}
    allowed = getattr(cg, "ALLOWED_KEYS_PER_PHASE", None)
    if not allowed:
        return {}
    return {"cuda_graph_config": {str(phase): list(keys) for phase, keys in allowed.items()}}


def main() -> int:
    logging.disable(logging.WARNING)  # SGLang's import-time chatter must not reach stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON
            import sglang
            from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # any import failure means: no usable sglang here
        print(f"cannot import sglang.srt.server_args: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags = [describe(a) for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    manifest = {
        "version": getattr(sglang, "__version__", "unknown"),
        "flags": flags,
        "converters": _converter_data(),
    }
    sys.stdout.write(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
