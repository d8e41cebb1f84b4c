"""Evaluate an agent on a split of tasks.

    python evaluate.py --config configs/<name>.yaml --split dev [--checkpoint DIR]

Thin by design: parse the command line, load the config, build, run. Evaluation itself
(`loop.evaluation`) is not part of this version yet; until it is, this command checks its
arguments and says so instead of pretending to evaluate.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

SPLITS = ("train", "dev", "test_normal", "test_challenge")


def main(argv: list[str] | None = None) -> int:
    """Parse, check, run; returns the exit status."""
    parser = argparse.ArgumentParser(description="Evaluate an agent on a task split.")
    parser.add_argument("--config", required=True, type=Path, help="YAML run configuration")
    parser.add_argument("--split", required=True, choices=SPLITS, help="which tasks to run")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint directory to load")
    parser.add_argument("overrides", nargs="*", help="config overrides as key=value")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"config file not found: {args.config}")
    if args.checkpoint is not None and not args.checkpoint.is_dir():
        parser.error(f"checkpoint directory not found: {args.checkpoint}")
    if importlib.util.find_spec("loop.evaluation") is None:
        print(
            "evaluate.py: evaluation (loop.evaluation) is not available in this version",
            file=sys.stderr,
        )
        return 2
    from loop.evaluation import main as evaluate_main  # type: ignore[import-not-found]

    return int(evaluate_main(args.config, args.split, args.checkpoint, args.overrides))


if __name__ == "__main__":
    sys.exit(main())
