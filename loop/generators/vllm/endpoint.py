"""One vLLM server as the `vllm_server` generator sees it: its state, and its adapter endpoints.

`Server` is what the generator (loop/generators/vllm/server.py) knows of one server: where it
is, whether its process is ours, the adapter versions it holds, whether it is in routing or
being restarted or re-probed, and its idle time. `load_on` makes a server serve a version
(`POST /v1/load_lora_adapter`, a 404 retried while a shared filesystem has not shown the files
yet, then the version confirmed in `GET /v1/models`); a name the server already holds is ours
only if we sent it there before (the server kept it through an outage), else an error: another
run's adapter is never replaced. `listed` is a server's `GET /v1/models`; `admin_post` is one
admin request whose transport error is a one-line `GeneratorError`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loop.generators.base import GeneratorError
from loop.generators.openai import OpenAIGenerator, server_message
from loop.generators.vllm.process import ServerProcess, healthy

PUBLISH_TIMEOUT_S = 120.0  # one adapter load (a 32B LoRA from a network filesystem: seconds)
LOAD_RETRIES = 5  # a 404 while the adapter's files are not yet visible on the server's host
LOAD_RETRY_S = 2.0
log = logging.getLogger(__name__)


@dataclass
class Server:
    """One server: where it is, whether we own its process, what it serves now."""

    url: str
    process: ServerProcess | None = None  # None: attached by URL (not ours to restart)
    served: str | None = None  # the version it serves; None: out of routing
    loaded: set[str] = field(default_factory=set)  # the adapter versions it holds now
    sent: set[str] = field(default_factory=set)  # every version we asked it to load (ours)
    outages: int = 0  # times it left routing: its requests in flight then are failed over
    in_flight: int = 0
    restarting: bool = False  # ours, dead: being started again (requests wait for it)
    probing: bool = False  # out of routing, asked again every `probe_every_s` (requests wait)
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

    def holds(self, version: str, base_model: str) -> bool:
        """Whether it is in routing and can sample `version` now."""
        if self.served is None or self.restarting:
            return False
        return version in (self.served, base_model) or version in self.loaded

    def down(self, timeout_s: float) -> bool:
        """Whether it is dead: its process gone (ours) or `GET /health` unanswered."""
        if self.process is not None and not self.process.alive():
            return True
        return not healthy(self.url, timeout_s)

    def forgot(self, admin: httpx.Client, version: str) -> bool:
        """Whether it answers `GET /v1/models` without `version` (restarted by its owner)."""
        try:
            return version not in listed(admin, self.url)
        except GeneratorError:
            return False  # not answering: `down` decides

    def idle_seconds(self) -> float:
        """Seconds so far with no request in flight on this server."""
        return self.idle_s + (time.monotonic() - self.idle_from if self.in_flight == 0 else 0.0)


def load_on(admin: httpx.Client, url: str, version: str, path: Path | None, sent: set[str]) -> None:
    """Make the server at `url` serve `version` (the adapter in `path`; None: the base weights,
    always served); `GeneratorError` in one line when it refuses or does not list it, or holds
    a `version` that is not in `sent` (the names we asked it to load, updated here)."""
    if path is None:
        return
    body = {"lora_name": version, "lora_path": str(path)}
    ours = version in sent
    for attempt in range(LOAD_RETRIES + 1):
        try:
            response = admin_post(admin, url, "/load_lora_adapter", body)
        except GeneratorError:
            sent.add(version)  # unanswered: it may load it later, and it is ours then
            raise
        if response.status_code == 200:
            sent.add(version)
            break
        message = server_message(response)
        if response.status_code == 400 and "already" in message:
            if ours:
                break  # loaded by us before it left routing: kept
            raise GeneratorError(
                f"{url} already holds an adapter named {version} that this run did not load "
                "(another run with this run's name and adapter nonce?): not replaced"
            )
        if response.status_code != 404 or attempt == LOAD_RETRIES:
            raise GeneratorError(
                f"{url} refused adapter {path} ({response.status_code}): {message}"
                + (" (is the path visible on the server's host?)" * (attempt > 0))
            )
        time.sleep(LOAD_RETRY_S)
    if version not in listed(admin, url):
        raise GeneratorError(f"{url} does not list {version} after loading it")


def listed(admin: httpx.Client, url: str) -> set[str]:
    """The model names the server at `url` serves (`GET /v1/models`); `GeneratorError` in one
    line when it does not answer."""
    try:
        models = admin.get(url + "/models").json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError, RuntimeError) as exc:
        raise GeneratorError(f"{url}/models: {type(exc).__name__}: {exc}") from None
    return {str(entry.get("id")) for entry in models if isinstance(entry, dict)}


def clear_leftovers(admin: httpx.Client, url: str, prefix: str) -> None:
    """Unload every adapter whose name starts with `prefix` from the server at `url`: the
    versions an earlier life of this run left there (a resumed run publishes its names again;
    another run's names never start like ours, its nonce differs)."""
    for name in sorted(listed(admin, url)):
        if name.startswith(prefix):
            log.warning("unloading %s, left on %s by this run before", name, url)
            admin_post(admin, url, "/unload_lora_adapter", {"lora_name": name})


def admin_post(admin: httpx.Client, url: str, path: str, body: dict[str, str]) -> httpx.Response:
    """POST `body` to the server's `path` (under /v1); a transport error is a `GeneratorError`."""
    try:
        return admin.post(url + path, json=body)
    except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: the client was closed
        raise GeneratorError(f"{url}{path}: {type(exc).__name__}: {exc}") from None


def states(servers: list[Server], probe_every_s: float) -> str:
    """Each server's state in one line: `servers 0 http://...: run-v3 (log: ...), 1 ...`."""
    described = []
    for i, s in enumerate(servers):
        state = (
            "restarting" if s.restarting else
            f"out, re-probed every {probe_every_s:.0f} s" if s.probing else
            s.served or "down for good"
        )  # fmt: skip
        where = f" (log: {s.process.log_path})" if s.process is not None else ""
        described.append(f"{i} {s.url}: {state}{where}")
    return "servers " + ", ".join(described)
