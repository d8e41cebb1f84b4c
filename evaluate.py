"""Evaluate an agent on a split of tasks.

    python evaluate.py --config configs/quickstart.yaml --split dev [--checkpoint DIR]
                       [--limit N] [--rollouts-per-task K] [--resume] [key=value ...]

Thin by design: parse, load the config, build (`loop.build.build_evaluation`), hand over to
`loop.evaluation.evaluate`. Results go to
`<output_dir>/<name>/eval/<split>/` (rollouts.jsonl, metrics.json, config.yaml).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse, check, run; returns the exit status."""
    parser = argparse.ArgumentParser(description="Evaluate an agent on a split of tasks.")
    parser.add_argument("--config", type=Path, help="YAML run configuration (required)")
    parser.add_argument(
        "--help-config", action="store_true", help="print every config key with its doc and exit"
    )
    parser.add_argument(
        "--split", help="which tasks, e.g. dev or easy_heldout (default: eval.split)"
    )
    parser.add_argument("--checkpoint", type=Path, help="a LoRA adapter directory to load")
    parser.add_argument("--limit", type=int, help="only the first N tasks of the split")
    parser.add_argument("--rollouts-per-task", type=int, help="K rollouts per task (pass@k)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rollouts an interrupted evaluation with the same model, agent and eval "
        "settings finished (of the same --checkpoint: yours to keep) and roll out the rest",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides as key=value")
    args = parser.parse_args(argv)
    if args.help_config:
        from loop.config import describe

        print(describe())
        return 0
    if args.config is None:
        parser.error("the following arguments are required: --config")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from loop.build import build_evaluation
    from loop.config import ConfigError, load_config
    from loop.evaluation import evaluate

    overrides = list(args.overrides)
    for key, value in (
        ("eval.split", args.split),
        ("eval.limit", args.limit),
        ("eval.rollouts_per_task", args.rollouts_per_task),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.checkpoint is not None and not args.checkpoint.is_dir():
        parser.error(f"checkpoint directory not found: {args.checkpoint}")
    try:
        parts = build_evaluation(config, args.checkpoint)
        evaluate(
            config, suite=parts.suite, generator=parts.generator, tokenizer=parts.tokenizer,
            pool=parts.pool, resume=args.resume,
        )  # fmt: skip
    except ConfigError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        print(
            "evaluate.py: interrupted; finished rollouts are in rollouts.jsonl "
            "(the same command with --resume rolls out only the rest)",
            file=sys.stderr,
        )
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
