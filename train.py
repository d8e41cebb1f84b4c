"""Train an agent with LOOP: `python train.py --config configs/<name>.yaml [key=value ...]`.

Thin by design: parse the command line, load the config (`loop.config`), build the model,
generator, suite and sandboxes (`loop.build.build_training`), and train (`loop.trainer.train`).
Running the same command again resumes from the run's last checkpoint. Several learner
processes: launch with `torchrun` (see README). `--preflight` plans the config at its world size
instead, with no GPU and no weights, and refuses what cannot work (docs/preflight.md).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Parse, check, run; returns the exit status."""
    parser = argparse.ArgumentParser(description="Train an agent with LOOP.")
    parser.add_argument("--config", type=Path, help="YAML run configuration (required)")
    parser.add_argument(
        "--help-config", action="store_true", help="print every config key with its doc and exit"
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="plan the config (memory per GPU, servers, host, files, disk, timeouts) and exit: "
        "0 for a plan, 2 when something cannot work (docs/preflight.md)",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="preflight: learner processes (default: torchrun's WORLD_SIZE, else what the "
        "config implies: the GPUs below generator.devices, or 1)",
    )
    parser.add_argument(
        "--gpu",
        default="h100",
        help="preflight: the GPU type (h100, h200, a100-80g, a100-40g; auto: this machine's)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides as key=value")
    args = parser.parse_args(argv)
    if args.help_config:
        from loop.config import describe

        print(describe())
        return 0
    if args.config is None:
        parser.error("the following arguments are required: --config")
    if not args.config.is_file():
        parser.error(f"config file not found: {args.config}")
    if args.preflight:
        return preflight(args.config, args.overrides, args.world_size, args.gpu)
    return run(args.config, args.overrides)


def preflight(config_path: Path, overrides: list[str], world_size: int | None, gpu: str) -> int:
    """Load, check, plan (loop/preflight); a refusal or a bad config is one line, exit 2."""
    from loop.checks import check_run
    from loop.config import ConfigError, load_config
    from loop.preflight.plan import learner_world_size
    from loop.preflight.report import preflight as plan_and_print

    if world_size is None and "WORLD_SIZE" in os.environ:
        world_size = int(os.environ["WORLD_SIZE"])
    try:
        config = load_config(config_path, overrides)
        world_size = learner_world_size(config, world_size)
        check_run(config, world_size)
        return plan_and_print(config, world_size=world_size, gpu=gpu)
    except (ConfigError, ValueError) as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # the traced step failed: no plan, and no refusal either
        print(f"train.py: preflight: {exc}", file=sys.stderr)
        return 1


def run(config_path: Path, overrides: list[str]) -> int:
    """Load, build, train; a bad config is one line, not a traceback."""
    from loop.build import build_training
    from loop.checks import check_run
    from loop.config import ConfigError, load_config
    from loop.generators.base import GeneratorError
    from loop.model.distributed import launched_world_size
    from loop.run.rundir import RunInUseError, lock_run
    from loop.trainer import train

    main = os.environ.get("RANK", "0") == "0"  # progress and the summary: one per run
    try:
        config = load_config(config_path, overrides)
        check_run(config, launched_world_size())  # before anything is loaded
        # rank 0 holds the run directory for the run's life: a second train.py on it is refused
        held = lock_run(config.run_dir) if main else contextlib.nullcontext()
        with held, build_training(config) as parts:
            metrics = train(config, parts, show_progress=main)
    except (ConfigError, RunInUseError) as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    except GeneratorError as exc:  # a server that cannot start or serve names its log
        print(f"train.py: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("train.py: interrupted; run the same command again to resume from the last "
              "checkpoint", file=sys.stderr)  # fmt: skip
        return 130
    if main:
        reward = metrics.get("rollout/reward_mean", math.nan)
        print(f"done: {config.run_dir} (final reward {reward:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
