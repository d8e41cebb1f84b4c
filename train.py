"""Train an agent with LOOP: `python train.py --config configs/<name>.yaml [key=value ...]`.

Thin by design: parse the command line, load the config, build, run. The trainer itself
(`loop.trainer`) is not part of this version yet; until it is, this command checks its
arguments and says so instead of pretending to train.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse, check, run; returns the exit status."""
    parser = argparse.ArgumentParser(description="Train an agent with LOOP.")
    parser.add_argument("--config", required=True, type=Path, help="YAML run configuration")
    parser.add_argument("overrides", nargs="*", help="config overrides as key=value")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"config file not found: {args.config}")
    if importlib.util.find_spec("loop.trainer") is None:
        print(
            "train.py: the trainer (loop.trainer) is not available in this version; "
            "`python -m sandbox` runs the sandbox tour",
            file=sys.stderr,
        )
        return 2
    from loop.trainer import main as train_main  # type: ignore[import-not-found]

    return int(train_main(args.config, args.overrides))


if __name__ == "__main__":
    sys.exit(main())
