#!/usr/bin/env python3
"""Regenerate search/manifests/sglang-<version>.json from the real SGLang wheels.

For each version: if this Python's installed sglang is that version, dump it directly;
otherwise `pip install --no-deps --target /tmp/sglang-<version> sglang==<version>` (once)
and dump with that directory first on PYTHONPATH. Only the parser is built, so no GPU is
needed. Older releases import a few extra packages at import time (safetensors, openai,
partial_json_parser, huggingface_hub, transformers, dill, sentencepiece): install those
into this Python first.

Usage: python scripts/gen_manifests.py [VERSION ...]     (default: every shipped version)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "search" / "manifests"
DUMP = MANIFESTS / "dump.py"
SHIPPED = ("0.5.8.post1", "0.5.9", "0.5.23")
# Flags (without -h) the reference counts for each release: a regenerated manifest must agree.
EXPECTED_FLAGS = {"0.5.8.post1": 328, "0.5.9": 331, "0.5.23": 531}

# SGLang 0.5.8/0.5.9 import torchvision at module level (multimodal preprocessing), never
# for the parser. When this Python has no working torchvision (a CPU torch has no matching
# wheel), an inert stand-in lets the parser import; it reports a version so transformers'
# feature probes stay consistent.
_TORCHVISION_STANDIN = '''
import importlib.abc, importlib.machinery, runpy, sys, types
class _Inert:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return _Inert()
    def __getattr__(self, name): return _Inert()
    def __mro_entries__(self, bases): return (object,)
class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"): raise AttributeError(name)
        return _Inert()
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec): return _Module(spec.name)
    def exec_module(self, module): module.__path__ = []; module.__version__ = "0.0.0"
sys.meta_path.insert(0, _Finder())
runpy.run_path(sys.argv[1], run_name="__main__")
'''


def installed_version() -> str | None:
    """The sglang version of this Python, without importing it."""
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


def needs_torchvision_standin() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        return True
    return False


def wheel_dir(version: str) -> Path:
    """/tmp/sglang-<version> with that wheel unpacked (installed once, no dependencies)."""
    target = Path(f"/tmp/sglang-{version}")
    if not (target / "sglang").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), f"sglang=={version}"],
            check=True,
        )
    return target


def dump(version: str) -> dict:
    """Run dump.py against the given SGLang release and return its manifest."""
    env = dict(os.environ)
    argv = [sys.executable, str(DUMP)]
    if installed_version() != version:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(wheel_dir(version)), env.get("PYTHONPATH")]))
        if needs_torchvision_standin():
            argv = [sys.executable, "-c", _TORCHVISION_STANDIN, str(DUMP)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"sglang {version}: dump failed:\n{proc.stderr[-3000:]}")
    manifest = json.loads(proc.stdout)
    if manifest["version"] != version:
        sys.exit(f"sglang {version}: dump reported version {manifest['version']}; check PYTHONPATH")
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(SHIPPED), help="SGLang versions (default: shipped)")
    args = parser.parse_args()
    for version in args.versions:
        manifest = dump(version)
        count = len(manifest["flags"])
        expected = EXPECTED_FLAGS.get(version)
        note = "" if expected is None else (" (matches reference)" if count == expected else f" (reference: {expected}!)")
        path = MANIFESTS / f"sglang-{version}.json"
        path.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {count} flags{note}")
        if expected is not None and count != expected:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
