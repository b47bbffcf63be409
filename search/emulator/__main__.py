"""`python -m search.emulator [SGLang flags]`: an SGLang server stand-in (see launch.py)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from search.emulator.launch import main as launch

    return launch(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
