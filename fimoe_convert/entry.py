"""The command's entry point (`fimoe-convert`, `python -m fimoe_convert`). The CLI's signal handlers exist only once
its modules are loaded (up to a second on a busy machine); a Ctrl-C before that is the same one line and exit 130."""

from __future__ import annotations

import signal
import sys

# cli._interrupted's line, spelled out: nothing of the package may load before the `try` below
EARLY_STOP = "error: interrupted (SIGINT); nothing was left half-done\n"


def run() -> None:
    try:
        from .cli import main
    except KeyboardInterrupt:
        sys.stderr.write(EARLY_STOP)
        raise SystemExit(128 + signal.SIGINT) from None
    main()
