"""The crash drills, N rounds of each fault, and their figures (docs/SECURITY.md).

Runs the distributed drills with real processes: the worker kill drill
(`tests/security/test_crash_drill.py`: ten kills of a Celery worker mid-stream, and a
Redis restart mid-turn), the Redis drills (`test_redis_drill.py`: Redis SIGKILLed and
restarted empty mid-stream, then the next turn on the same worker; Redis restarted
while a turn is queued) and the PostgreSQL drill (`test_postgres_drill.py`: the test's
own server fast-stopped during a turn's final save), each `--rounds` times (default 10),
and prints the figures they recorded. Every round asserts its outcome (no token lost or
reordered on the page, no turn stuck or failed, the worker alive), so a figure is only
printed for drills that passed.

    env $(make's TEST_ENV) DATABASE_URL=postgres://... REDIS_URL=redis://.../n \
        .venv/bin/python bench/crash_drill.py --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARTIFACT = REPO / "artifacts" / "security-figures.json"
DRILLS = [
    "tests/security/test_crash_drill.py",
    "tests/security/test_redis_drill.py",
    "tests/security/test_postgres_drill.py",
]
PREFIXES = ("crash.", "redis.", "postgres.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("drills", nargs="*", default=DRILLS)
    args = parser.parse_args()
    for name in ("DATABASE_URL", "REDIS_URL"):
        if not os.environ.get(name):
            print(f"{name} is not set: the drills run in distributed mode", file=sys.stderr)
            return 2
    # Only this run's figures: drop the drills' keys an earlier run left in the artifact.
    if ARTIFACT.exists():
        kept = {
            k: v for k, v in json.loads(ARTIFACT.read_text()).items() if not k.startswith(PREFIXES)
        }
        ARTIFACT.write_text(json.dumps(kept, indent=2) + "\n")
    started = time.time()
    env = {**os.environ, "DRILL_ROUNDS": str(args.rounds)}
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "pytest"), "-m", "distributed", "-q", *args.drills],
        cwd=REPO,
        env=env,
    )
    figures = json.loads(ARTIFACT.read_text()) if ARTIFACT.exists() else {}
    print(f"\ncrash drills, {args.rounds} rounds each, {time.time() - started:.0f} s")
    print(f"{'figure':45} {'value':>6}  what")
    for key, figure in sorted(figures.items()):
        if key.startswith(PREFIXES):
            print(f"{key:45} {figure['count']:>6}  {figure['what']}")
    print("PASS" if done.returncode == 0 else f"FAIL (pytest exit {done.returncode})")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
