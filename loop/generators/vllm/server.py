"""The `vllm_server` generator: N vLLM OpenAI servers, trained through versioned LoRA adapters.

The topology every large RL trainer uses (apple/ml-loop, TRL's server mode, prime-rl, SkyRL,
AReaL): inference runs in server processes of its own, on devices of its own, outside the
learners' process group; rank 0 talks to the servers over HTTP. Servers are started here
(loop/generators/vllm/process.py: clean environment, own devices, loopback, ended with the
trainer) or attached by URL (`generator.servers`, e.g. servers on other nodes).

Requests: token in, token out through vLLM's completions API (loop/generators/openai.py's
token-id mode: prompt ids in, the sampled ids and their processed log-probs out). Routing
(vllm/routing.py): a task's K rollouts and every later turn of each go to one server,
with one adapter version; new groups go to the least-loaded server.

Versions. `load_adapter(path)` publishes a new adapter under a name never used before in this
run, `<prefix>-v<k>`, on every server (`POST /v1/load_lora_adapter`; a 404 is retried for a
shared filesystem that has not shown the files yet), confirms it in `GET /v1/models`, and only
then routes new groups to it. Each request carries `cache_salt` = its version (plus this
trainer's nonce), so no prefix-cache block computed under other weights is ever reused
(reusing one name across weights reuses stale blocks: vllm#42125). A server that fails to load
leaves routing (never serves a mixed version) and is restarted when it was started here.
The newest `keep_versions` versions stay loaded (1: only the current one; S + 1 when the
trainer collects S iterations ahead, `train.overlap.max_staleness`), so a request may name an older
one (`SamplingParams.version`: every turn of a group samples the version current when the
group was dispatched); an older version is retired and unloaded once no request uses it, and
a request naming a retired one fails (`GeneratorError`).

Failures. A started server that dies is restarted in the background (up to `max_restarts`
times) and given the current adapter before it returns to routing; the requests it had in
flight fail as `GeneratorError` (the rollouts become infrastructure failures, excluded and
counted), and its groups' later requests go to another server. When no server is ready, a
request waits up to `ready_timeout_s` for one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loop.generators.base import Generation, GeneratorError, GeneratorStats, SamplingParams
from loop.generators.openai import OpenAIGenerator, server_message
from loop.generators.vllm.process import ServerProcess, healthy
from loop.generators.vllm.routing import PrefixRouter

log = logging.getLogger(__name__)
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
    restarting: bool = False
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


class VLLMServerGenerator:
    """LOOP's sampler over vLLM OpenAI servers (see the module docstring)."""

    name = "vllm_server"
    shares_weights = False  # the servers hold their own copy; adapters are published

    def __init__(
        self,
        *,
        base_model: str,
        adapter_prefix: str,
        processes: Sequence[ServerProcess] = (),
        urls: Sequence[str] = (),
        start_timeout_s: float = 600.0,
        ready_timeout_s: float = 600.0,
        request_timeout_s: float = 600.0,
        max_concurrency: int = 256,
        max_restarts: int = 3,
        keep_versions: int = 1,
    ):
        """Start `processes` (in parallel) and attach to `urls`; `GeneratorError` when a started
        server fails (its cause in one line) or an attached one does not answer `/health`.

        `base_model`: the name the servers serve the base weights under; `adapter_prefix`: the
        run's name, the stem of every version's name; `keep_versions`: the newest versions kept
        loaded (the servers' `--max-loras` must hold them)."""
        if not processes and not urls:
            raise ValueError("the vllm_server generator needs servers to start or URLs")
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.keep_versions = keep_versions
        self.base_model, self.adapter_prefix = base_model, adapter_prefix
        self.start_timeout_s, self.ready_timeout_s = start_timeout_s, ready_timeout_s
        self.request_timeout_s, self.max_concurrency = request_timeout_s, max_concurrency
        self.max_restarts = max_restarts
        self.servers = [Server(url) for url in urls]
        self.servers += [Server(p.url, process=p) for p in processes]
        self.current = base_model  # the version new groups get
        self.adapter_path: Path | None = None
        self.restarts = 0
        self._nonce = secrets.token_hex(4)  # this trainer's cache salts differ from any other's
        self._versions = itertools.count(1)
        self._using: Counter[str] = Counter()  # requests in flight per version
        self._retired: set[str] = set()  # versions to unload once no request uses them
        self._live: list[str] = []  # the adapter versions kept loaded, oldest first
        self._router = PrefixRouter()
        self._lock = threading.Lock()  # server state, shared with the restart threads
        self._admin = httpx.Client(timeout=ADMIN_TIMEOUT_S)
        try:
            self._start_all(processes)
        except BaseException:
            self._stop_all()
            raise
        for server in self.servers:
            if server.process is None and not healthy(server.url):
                self._stop_all()
                raise GeneratorError(f"no vLLM server answers at {server.url} (generator.servers)")
            server.served = base_model

    @property
    def version(self) -> str:
        """The version new groups sample: the newest published (the base before any)."""
        return self.current

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """Sample on the server of the prompt's group, with `params.version` (None: the
        version the group was pinned to when it started, the current one for a new group)."""
        if not prompt_token_ids:
            raise GeneratorError("empty prompt: at least one token id is needed")
        index, version = await self._route(prompt_token_ids, params.version)
        server = self.servers[index]
        client = await self._client(server)
        server.begin()
        self._using[version] += 1
        try:
            salt = {"cache_salt": f"{version}-{self._nonce}"}
            generation = await client.generate(
                prompt_token_ids, params, model=version, extra_fields=salt
            )
        except GeneratorError as exc:
            if server.process is not None and not server.process.alive():
                self._lost(index)
                raise GeneratorError(f"vLLM server {index} died during the request") from exc
            raise
        finally:
            server.end()
            self._using[version] -= 1
            if version in self._retired and not self._using[version]:
                await asyncio.to_thread(self._unload, version)
        return dataclasses.replace(generation, server=index, adapter_version=version)

    def idle_seconds(self) -> float:
        """Seconds so far that a server had no request in flight, the mean over the servers
        (the trainer logs each iteration's share: `time/server_idle_*`)."""
        return sum(server.idle_seconds() for server in self.servers) / len(self.servers)

    def stats(self) -> GeneratorStats:
        """The servers' idle time so far (`idle_seconds`)."""
        return GeneratorStats(server_idle_s=self.idle_seconds())

    def load_adapter(self, path: Path | None) -> None:
        """Publish the adapter in `path` (None: the base weights) as a new version on every
        server; new groups sample from it once its load is confirmed (see the module docstring).

        Called between iterations, with no request of the new version in flight."""
        version = f"{self.adapter_prefix}-v{next(self._versions)}" if path else self.base_model
        path = Path(path).resolve() if path else None
        loaded, failures, dead = [], {}, {}
        with self._lock:
            previous, previous_path = self.current, self.adapter_path
            self.current, self.adapter_path = version, path
        for index, server in enumerate(self.servers):
            if server.restarting:
                continue  # it loads the current version itself before it returns
            try:
                self._load_on(server, version, path)
                loaded.append(index)
            except GeneratorError as exc:
                if server.process is not None and not (
                    server.process.alive() and healthy(server.url)
                ):
                    dead[index] = str(exc)  # ours and gone: restarted with this version
                else:
                    failures[index] = str(exc)
        if failures and not loaded and not dead:  # the adapter's fault: the servers keep serving
            with self._lock:
                self.current, self.adapter_path = previous, previous_path
            raise GeneratorError(f"no vLLM server loaded {version}: {'; '.join(failures.values())}")
        for index in loaded:
            self.servers[index].served = version
            self.servers[index].loaded.add(version)
        for index, failure in (failures | dead).items():
            log.warning("vLLM server %d leaves routing: %s", index, failure)
            self._lost(index)  # restarted with the current version where it is ours
        self._live = [v for v in self._live if v != version] + [version] * (path is not None)
        while len(self._live) > self.keep_versions:  # the oldest leave once no request uses them
            old = self._live.pop(0)
            self._retired.add(old)
            if not self._using[old]:
                self._unload(old)

    def release_memory(self) -> None:
        """Nothing: the servers' memory is not the learners'."""

    async def close(self) -> None:
        """Close the clients and stop the servers started here (attached ones keep running)."""
        for server in self.servers:
            if server.client is not None:
                await server.client.close()
                server.client = None
        await asyncio.to_thread(self._stop_all)
        self._admin.close()

    # -- routing ----------------------------------------------------------------------------

    async def _route(self, prompt: list[int], wanted: str | None) -> tuple[int, str]:
        """(server index, version) for `prompt`, sampling `wanted` (None: the current
        version), waiting for a server when none is ready."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            self._check_processes()
            version = wanted or self.current
            if version not in (self.current, self.base_model) and version not in self._live:
                raise GeneratorError(f"{version} is no longer served (retired: the servers keep "
                                     f"the newest {self.keep_versions} versions)")  # fmt: skip
            ready = {i: version for i, s in enumerate(self.servers) if self._holds(s, version)}
            if ready:
                load = {i: s.in_flight for i, s in enumerate(self.servers)}
                pin = self._router.route(prompt, ready, load)
                return pin.server, pin.version
            if not any(s.restarting for s in self.servers):
                raise GeneratorError(f"no vLLM server serves {version}: {self._states()}")
            if time.monotonic() > deadline:
                raise GeneratorError(
                    f"no vLLM server ready after {self.ready_timeout_s:.0f} s: {self._states()}"
                )
            await asyncio.sleep(0.5)

    async def _client(self, server: Server) -> OpenAIGenerator:
        """The server's HTTP client (a new one when a restart moved it to another port)."""
        if server.client is None or server.client_url != server.url:
            if server.client is not None:
                await server.client.close()
            server.client = OpenAIGenerator(
                server.url, self.base_model, timeout_s=self.request_timeout_s,
                max_concurrency=self.max_concurrency, max_retries=1, backoff_s=0.5,
            )  # fmt: skip
            server.client_url = server.url
        return server.client

    def _holds(self, server: Server, version: str) -> bool:
        """Whether `server` is in routing and can sample `version` now."""
        if server.served is None or server.restarting:
            return False
        return version == server.served or version == self.base_model or version in server.loaded

    def _states(self) -> str:
        return ", ".join(
            f"{i}: {'restarting' if s.restarting else s.served or 'down'}"
            for i, s in enumerate(self.servers)
        )

    # -- adapters -----------------------------------------------------------------------------

    def _load_on(self, server: Server, version: str, path: Path | None) -> None:
        """Make `server` serve `version` (the adapter in `path`; None: the base weights)."""
        if path is None:
            return  # the base weights are always served
        body = {"lora_name": version, "lora_path": str(path)}
        for attempt in range(LOAD_RETRIES + 1):
            response = self._admin_post(server, "/load_lora_adapter", body)
            if response.status_code == 200:
                break
            message = server_message(response)
            if response.status_code == 400 and "already" in message:  # left by an earlier run
                self._admin_post(server, "/unload_lora_adapter", {"lora_name": version})
                continue
            if response.status_code != 404 or attempt == LOAD_RETRIES:
                raise GeneratorError(
                    f"{server.url} refused adapter {path} ({response.status_code}): {message}"
                    + (" (is the path visible on the server's host?)" * (attempt > 0))
                )
            time.sleep(LOAD_RETRY_S)
        models = self._admin.get(server.url + "/models").json().get("data", [])
        if version not in {entry.get("id") for entry in models}:
            raise GeneratorError(f"{server.url} does not list {version} after loading it")

    def _unload(self, version: str) -> None:
        """Unload a retired version from every server that still answers."""
        self._retired.discard(version)
        for server in self.servers:
            server.loaded.discard(version)
            if server.restarting or server.served is None:
                continue
            try:
                self._admin_post(server, "/unload_lora_adapter", {"lora_name": version})
            except GeneratorError as exc:
                log.warning("could not unload %s: %s", version, exc)

    def _admin_post(self, server: Server, path: str, body: dict[str, str]) -> httpx.Response:
        try:
            return self._admin.post(server.url + path, json=body)
        except httpx.HTTPError as exc:
            raise GeneratorError(f"{server.url}{path}: {type(exc).__name__}: {exc}") from None

    # -- process life ---------------------------------------------------------------------------

    def _start_all(self, processes: Sequence[ServerProcess]) -> None:
        """Start the servers together (each takes tens of seconds); the first failure raises."""
        if not processes:
            return
        with ThreadPoolExecutor(len(processes)) as pool:
            for future in [pool.submit(p.start, self.start_timeout_s) for p in processes]:
                future.result()
        for server in self.servers:
            if server.process is not None:
                server.url = server.process.url

    def _check_processes(self) -> None:
        """Take servers whose process died out of routing (and restart them)."""
        for index, server in enumerate(self.servers):
            process = server.process
            if process is not None and server.served is not None and not process.alive():
                self._lost(index)

    def _lost(self, index: int) -> None:
        """Server `index` left routing: restart it in the background if it is ours."""
        server = self.servers[index]
        with self._lock:
            if server.restarting:
                return
            server.served = None
            server.loaded.clear()  # a restarted server holds only the current version
            self._router.forget_server(index)
            if server.process is None or server.restarts >= self.max_restarts:
                log.error("vLLM server %d at %s is out of routing for good", index, server.url)
                return
            server.restarting, server.restarts = True, server.restarts + 1
            self.restarts += 1
        log.warning("restarting vLLM server %d (restart %d)", index, server.restarts)
        threading.Thread(target=self._restart, args=(index,), daemon=True).start()

    def _restart(self, index: int) -> None:
        """Start server `index` again and bring it to the current version before routing."""
        server = self.servers[index]
        assert server.process is not None, f"server {index} is not ours to restart"
        try:
            server.process.start(self.start_timeout_s)
            server.url = server.process.url
            while True:  # a publication may land while we load: load until we are current
                with self._lock:
                    version, path = self.current, self.adapter_path
                self._load_on(server, version, path)
                with self._lock:
                    if self.current == version:
                        server.served = version
                        server.loaded = {version}
                        log.warning("vLLM server %d is back, serving %s", index, version)
                        return
        except GeneratorError as exc:
            log.error("vLLM server %d could not be restarted: %s", index, exc)
            server.process.stop()
        finally:
            server.restarting = False

    def _stop_all(self) -> None:
        for server in self.servers:
            if server.process is not None:
                server.process.stop()
