"""Run a fake provider as its own process (beside Celery workers and Daphne).

    python -m tests.fakes --provider openai --port 0 [--script replies.json]

The first line on stdout is the base URL (flushed at once, so a parent can read it
and go on); the process serves until SIGTERM or SIGINT. Script it at start with a
JSON file (tests.fakes.script documents the format) or later through the control
endpoints: POST /_fake/script, GET /_fake/requests, GET /_fake/disconnects,
POST /_fake/clear.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from . import FAKES
from .script import Script


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes", description=__doc__)
    parser.add_argument("--provider", choices=sorted(FAKES), required=True)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", type=Path, help="JSON script of replies")
    parser.add_argument(
        "--api-key", default="test-key", help="expected key; 'none' accepts any (Ollama)"
    )
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between events")
    parser.add_argument("--models", help="comma-separated known models (default: any)")
    parser.add_argument(
        "--reasoning-field", choices=("reasoning_content", "reasoning"), help="openai only"
    )
    parser.add_argument("--no-validate", action="store_true", help="skip request checks")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    options: dict[str, Any] = {
        "port": args.port,
        "api_key": None if args.api_key.lower() == "none" else args.api_key,
        "delay": args.delay,
        "validate": not args.no_validate,
        "models": args.models.split(",") if args.models else None,
    }
    if args.script is not None:
        options["script"] = Script.from_json(json.loads(args.script.read_text()))
    if args.reasoning_field and args.provider == "openai":
        options["reasoning_field"] = args.reasoning_field
    fake = FAKES[args.provider](**options).start()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    sys.stdout.write(fake.base_url + "\n")
    sys.stdout.flush()
    try:
        stop.wait()
    finally:
        fake.stop()


if __name__ == "__main__":
    main()
