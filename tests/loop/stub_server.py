"""A stand-in for vLLM's OpenAI server in `ServerProcess` tests: it starts in a blink.

    python -m tests.loop.stub_server [--env-out FILE] [--fail-with TEXT] [--never-ready]
        [--fail-loads N] [--slow-s S] [--load-s L] [--health-s T] --host H --port P

Writes its environment to FILE (JSON), then serves `GET /health` with 200, the adapter
endpoints a publication uses (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`,
`GET /v1/models`: the names loaded, no weights), and `POST /v1/completions` as vLLM's token
mode answers it (token 5 then the first stop id asked for, or 5s up to `max_tokens` when none,
with their log-probs; the answer names the model asked for and so does its text, followed for
an adapter by the path it was loaded from, so a test sees which version sampled and whose
weights; a request for 100 tokens or more takes S seconds, long enough to kill the server under
it). Like vLLM, a model not loaded is a 404 and loading a name already loaded a 400 ("... has
already been loaded"). `--fail-with` prints TEXT and exits 1 instead (a failed start-up),
`--never-ready` answers 503 forever, `--fail-loads N` refuses the first N adapter loads (500),
`--load-s L` makes each load take L seconds, `--health-s T` each `GET /health` T seconds (a
busy server); `POST /forget` drops every adapter (a server restarted by its owner).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--env-out")
    parser.add_argument("--fail-with")
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--fail-loads", type=int, default=0)
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--health-s", type=float, default=0.0)
    args = parser.parse_args()
    if args.env_out:
        with open(args.env_out, "w") as out:
            json.dump({**os.environ, "STUB_PGID": str(os.getpgid(0))}, out)
    if args.fail_with:
        print(f"INFO starting\nERROR {args.fail_with}", flush=True)
        sys.exit(1)
    status = 503 if args.never_ready else 200

    loaded = {"base": ""}  # name -> the path it was loaded from
    refusals = [args.fail_loads]

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self.answer(200, {"data": [{"id": name} for name in sorted(loaded)]})
                return
            if self.path == "/health":
                time.sleep(args.health_s)
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/completions":
                if body["model"] not in loaded:
                    message = f"The model `{body['model']}` does not exist."
                    self.answer(404, {"error": {"message": message}})
                    return
                if body["max_tokens"] >= 100:
                    time.sleep(args.slow_s)
                stop = body.get("stop_token_ids") or []
                ids = [5, stop[0]] if stop else [5] * body["max_tokens"]
                text = " ".join(filter(None, (body["model"], loaded.get(body["model"]))))
                choice = {"text": text, "token_ids": ids,
                          "finish_reason": "stop" if stop else "length",
                          "logprobs": {"token_logprobs": [-0.5] * len(ids)}}  # fmt: skip
                self.answer(200, {"model": body["model"], "choices": [choice]})
                return
            if self.path == "/v1/load_lora_adapter" and refusals[0] > 0:
                refusals[0] -= 1
                self.answer(500, {"error": {"message": "the adapter could not be read"}})
                return
            if self.path == "/v1/load_lora_adapter" and body["lora_name"] in loaded:
                message = f"The lora adapter '{body['lora_name']}' has already been loaded."
                self.answer(400, {"error": {"message": message}})
                return
            if self.path == "/v1/load_lora_adapter":
                time.sleep(args.load_s)
                loaded[body["lora_name"]] = body["lora_path"]
            elif self.path == "/v1/unload_lora_adapter":
                loaded.pop(body["lora_name"], None)
            elif self.path == "/forget":
                for name in [name for name in loaded if name != "base"]:
                    del loaded[name]
            else:
                self.answer(404, {"error": {"message": f"no {self.path}"}})
                return
            self.answer(200, {})

        def answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((args.host, args.port), Health).serve_forever()


if __name__ == "__main__":
    main()
