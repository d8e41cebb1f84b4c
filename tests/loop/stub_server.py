"""A stand-in for vLLM's OpenAI server in `ServerProcess` tests: it starts in a blink.

    python -m tests.loop.stub_server [--env-out FILE] [--fail-with TEXT] [--never-ready]
        --host H --port P

Writes its environment to FILE (JSON), then serves `GET /health` with 200; `--fail-with` prints
TEXT and exits 1 instead (a failed start-up), `--never-ready` answers 503 forever.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--env-out")
    parser.add_argument("--fail-with")
    parser.add_argument("--never-ready", action="store_true")
    args = parser.parse_args()
    if args.env_out:
        with open(args.env_out, "w") as out:
            json.dump({**os.environ, "STUB_PGID": str(os.getpgid(0))}, out)
    if args.fail_with:
        print(f"INFO starting\nERROR {args.fail_with}", flush=True)
        sys.exit(1)
    status = 503 if args.never_ready else 200

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    HTTPServer((args.host, args.port), Health).serve_forever()


if __name__ == "__main__":
    main()
