"""Train an agent with LOOP: `python train.py --config configs/<name>.yaml [key=value ...]`.

Thin by design: parse the command line, then `loop.trainer.main` loads the config, builds the
model, generator, suite and sandboxes, and trains. Running the same command again resumes from
the run's last checkpoint. Several learner processes: launch with `torchrun` (see README).
"""

from __future__ import annotations

import argparse
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
    from loop.trainer import main as train_main

    return int(train_main(args.config, args.overrides))


if __name__ == "__main__":
    sys.exit(main())
