"""`python -m tasks.openenv serve --suite apptown [--split dev] [--port 8000]`: serve a suite
as an OpenEnv environment (tasks/openenv/server.py) until interrupted.

Sessions are bounded by `--max-sessions`; each holds one sandbox while its episode runs, so the
sandbox flags size what one session may use. On exit (Ctrl-C, SIGTERM) the server stops taking
messages and every sandbox is destroyed. A bad argument is a one-line error (exit status 2).

Idle sessions end after `--idle-timeout-s`; a request's headers must arrive within
`--header-timeout-s`. `--token` (or the LOOP_OPENENV_TOKEN environment variable) makes every
request but `GET /health` carry `Authorization: Bearer <token>`; binding beyond the loopback
without one is refused.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from tasks.core import SuiteSetupError

DEFAULT_PORT = 8000
MAX_MESSAGE_BYTES = 1 << 20  # one WebSocket message, at most: a cell is far smaller
MAX_OUTPUT_CHARS = 20_000  # a cell's output is cut past this (the sandbox section's default)
TOKEN_ENV = "LOOP_OPENENV_TOKEN"  # the token, when --token is not given


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (only `serve` so far)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.openenv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a task suite as an OpenEnv environment")
    serve.add_argument("--suite", default="apptown", help="a suite of tasks/registry.py")
    serve.add_argument("--split", default="dev", help="the split whose tasks are served")
    serve.add_argument("--seed", type=int, default=0, help="the suite's seed (its world)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--max-sessions", type=int, default=32, help="open sessions at most")
    serve.add_argument("--max-steps", type=int, default=50, help="steps of one episode at most")
    serve.add_argument("--pool-size", type=int, default=4, help="warm sandboxes kept ready")
    serve.add_argument("--cell-timeout", type=float, default=30.0, help="seconds one cell may run")
    serve.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES)
    idle, head = "a silent session ends after this", "a request's headers arrive within this"
    serve.add_argument("--idle-timeout-s", type=float, default=300.0, help=idle)
    serve.add_argument("--header-timeout-s", type=float, default=10.0, help=head)
    token_help = f"the clients' bearer token (default: ${TOKEN_ENV})"
    serve.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=token_help)
    return parser.parse_args(argv)


def serve(args: argparse.Namespace) -> None:
    """Build the suite, the pool and the app; run until interrupted; destroy every sandbox."""
    import uvicorn

    from sandbox import KernelPool
    from tasks.openenv.guard import is_loopback, with_header_timeout
    from tasks.openenv.server import build_app
    from tasks.registry import RunSettings, suite_for_run

    if not args.token and not is_loopback(args.host):
        raise ValueError(
            f"--host {args.host} reaches beyond this machine: set --token (or ${TOKEN_ENV})"
        )

    settings = RunSettings(args.seed, args.pool_size, args.cell_timeout, MAX_OUTPUT_CHARS)
    suite = suite_for_run(args.suite, settings)
    pool = None
    if suite.uses_sandbox:
        pool = KernelPool(size=args.pool_size, timeout_s=args.cell_timeout)
    # uvicorn stops gracefully on SIGTERM, then raises it again under the handler it found:
    # this one exits through the `finally` below, so the pool destroys every sandbox.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        limits = {"max_sessions": args.max_sessions, "max_steps": args.max_steps}
        limits |= {"idle_timeout_s": args.idle_timeout_s, "longest_step_s": args.cell_timeout + 60}
        app = build_app(suite, pool, split=args.split, token=args.token or None, **limits)
        print(f"serving {args.suite}/{args.split} on ws://{args.host}:{args.port}/ws", flush=True)
        http = with_header_timeout(args.header_timeout_s)
        wire = {"ws_max_size": args.max_message_bytes, "http": http, "log_level": "warning"}
        uvicorn.run(app, host=args.host, port=args.port, **wire)
    finally:
        if pool is not None:
            pool.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point; bad input is one line on stderr and exit status 2."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        serve(args)
    except (KeyError, ValueError, SuiteSetupError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
