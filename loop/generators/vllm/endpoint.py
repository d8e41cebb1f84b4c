"""One vLLM server as the `vllm_server` generator sees it: its state, and its adapter endpoints.

`Server` is what the generator (loop/generators/vllm/server.py) knows of one server: where it
is, whether its process is ours, the adapter versions it holds, whether it is in routing or
being restarted or re-probed, and its idle time. `load_on` makes a server serve a version
(`POST /v1/load_lora_adapter`, a 404 retried while a shared filesystem has not shown the files
yet, then the version confirmed in `GET /v1/models`); `admin_post` is one admin request whose
transport error is a one-line `GeneratorError`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loop.generators.base import GeneratorError
from loop.generators.openai import OpenAIGenerator, server_message
from loop.generators.vllm.process import ServerProcess

ADMIN_TIMEOUT_S = 120.0  # one adapter load (a 32B LoRA from a network filesystem: seconds)
LOAD_RETRIES = 5  # a 404 while the adapter's files are not yet visible on the server's host
LOAD_RETRY_S = 2.0


@dataclass
class Server:
    """One server: where it is, whether we own its process, what it serves now."""

    url: str
    process: ServerProcess | None = None  # None: attached by URL (not ours to restart)
    served: str | None = None  # the version it serves; None: out of routing
    loaded: set[str] = field(default_factory=set)  # the adapter versions it holds now
    in_flight: int = 0
    restarting: bool = False  # ours, dead: being started again (requests wait for it)
    probing: bool = False  # out of routing, asked again every `probe_every_s` (none wait)
    wake: threading.Event = field(default_factory=threading.Event)  # probe now (a publication)
    restarts: int = 0
    client: OpenAIGenerator | None = None
    client_url: str = ""
    idle_s: float = 0.0  # seconds with no request in flight, up to `idle_from`
    idle_from: float = field(default_factory=lambda: time.monotonic())  # since when none is

    def begin(self) -> None:
        """A request starts on this server."""
        if self.in_flight == 0:
            self.idle_s += time.monotonic() - self.idle_from
        self.in_flight += 1

    def end(self) -> None:
        """A request on this server ended (answered or failed)."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle_from = time.monotonic()

    def idle_seconds(self) -> float:
        """Seconds so far with no request in flight on this server."""
        return self.idle_s + (time.monotonic() - self.idle_from if self.in_flight == 0 else 0.0)


def load_on(admin: httpx.Client, url: str, version: str, path: Path | None) -> None:
    """Make the server at `url` serve `version` (the adapter in `path`; None: the base weights,
    always served); `GeneratorError` in one line when it refuses or does not list it."""
    if path is None:
        return
    body = {"lora_name": version, "lora_path": str(path)}
    for attempt in range(LOAD_RETRIES + 1):
        response = admin_post(admin, url, "/load_lora_adapter", body)
        if response.status_code == 200:
            break
        message = server_message(response)
        if response.status_code == 400 and "already" in message:  # left by an earlier run
            admin_post(admin, url, "/unload_lora_adapter", {"lora_name": version})
            continue
        if response.status_code != 404 or attempt == LOAD_RETRIES:
            raise GeneratorError(
                f"{url} refused adapter {path} ({response.status_code}): {message}"
                + (" (is the path visible on the server's host?)" * (attempt > 0))
            )
        time.sleep(LOAD_RETRY_S)
    try:
        models = admin.get(url + "/models").json().get("data", [])
    except (httpx.HTTPError, ValueError) as exc:
        raise GeneratorError(f"{url}/models: {type(exc).__name__}: {exc}") from None
    if version not in {entry.get("id") for entry in models}:
        raise GeneratorError(f"{url} does not list {version} after loading it")


def admin_post(admin: httpx.Client, url: str, path: str, body: dict[str, str]) -> httpx.Response:
    """POST `body` to the server's `path` (under /v1); a transport error is a `GeneratorError`."""
    try:
        return admin.post(url + path, json=body)
    except httpx.HTTPError as exc:
        raise GeneratorError(f"{url}{path}: {type(exc).__name__}: {exc}") from None
