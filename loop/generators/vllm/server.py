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
leaves routing (never serves a mixed version) and is re-probed (below).
The newest `keep_versions` versions stay loaded (1: only the current one; S + 1 when the
trainer collects S iterations ahead, `train.overlap.max_staleness`), so a request may name an older
one (`SamplingParams.version`: every turn of a group samples the version current when the
group was dispatched); an older version is retired and unloaded once no request uses it, and
a request naming a retired one fails (`GeneratorError`).

Failures. A server that dies costs only time. A request whose server is found dead after the
request failed (no connection, a reset: `ServerFailureError`; never an answer about the request,
such as a 4xx) is re-sent, whole from the same prompt and with the same version, to a server
that holds that version (another, or this one once restarted), up to `request_resends` times:
the rollout's earlier turns are unchanged, so the trajectory stays token exact, and the group's
later requests follow it. The dead server leaves routing: a started one is restarted in the
background (up to `max_restarts` times), an attached one (or one that answers but refused an
adapter) is re-probed every `probe_every_s` and at each publication; either returns to routing
only once it holds the current version (`GET /health` answered, the adapter loaded and listed).
While a started server restarts and no other is ready, a request waits up to `ready_timeout_s`
(default: as long as a start may take); with none ready and none restarting it fails at once, in
one line naming each server, its state and its log. `stats()` counts the failures, restarts and
re-sent requests (`servers/*` in the run's metrics).
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
from pathlib import Path

import httpx

from loop.generators.base import Generation, GeneratorError, GeneratorStats, SamplingParams
from loop.generators.openai import OpenAIGenerator, ServerFailureError
from loop.generators.tokenizer import Tokenizer
from loop.generators.vllm.endpoint import (
    ADMIN_TIMEOUT_S,
    LOAD_RETRIES,
    LOAD_RETRY_S,
    Server,
    admin_post,
    load_on,
)
from loop.generators.vllm.process import ServerProcess, healthy
from loop.generators.vllm.routing import PrefixRouter

log = logging.getLogger(__name__)
# An attached server out of routing is asked again this often: the 404 window of a load
# (LOAD_RETRIES x LOAD_RETRY_S), so a filesystem that was slow to show the files is not
# waited on for longer than it took to give up on it.
PROBE_EVERY_S = LOAD_RETRIES * LOAD_RETRY_S
REQUEST_RESENDS = 2  # a request re-sent after its server died: at most on two more servers


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
        ready_timeout_s: float | None = None,
        request_timeout_s: float = 600.0,
        max_concurrency: int = 256,
        max_restarts: int = 3,
        keep_versions: int = 1,
        probe_every_s: float = PROBE_EVERY_S,
        request_resends: int = REQUEST_RESENDS,
        tokenizer: Tokenizer | None = None,
    ):
        """Start `processes` (in parallel) and attach to `urls`; `GeneratorError` when a started
        server fails (its cause in one line) or an attached one does not answer `/health`.

        `base_model`: the name the servers serve the base weights under; `adapter_prefix`: the
        run's name, the stem of every version's name; `keep_versions`: the newest versions kept
        loaded (the servers' `--max-loras` must hold them); `probe_every_s`: how often a
        server out of routing is asked again; `request_resends`: how many other servers a
        request whose server died is re-sent to; `tokenizer`: the policy's, against which every
        answer's ids and text are checked (loop/generators/validate.py)."""
        if not processes and not urls:
            raise ValueError("the vllm_server generator needs servers to start or URLs")
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.keep_versions = keep_versions
        self.base_model, self.adapter_prefix = base_model, adapter_prefix
        self.start_timeout_s = start_timeout_s
        # a request waits for a restart as long as a start may take (None)
        self.ready_timeout_s = start_timeout_s if ready_timeout_s is None else ready_timeout_s
        self.request_timeout_s, self.max_concurrency = request_timeout_s, max_concurrency
        self.max_restarts, self.probe_every_s = max_restarts, probe_every_s
        self.request_resends, self.tokenizer = request_resends, tokenizer
        self.servers = [Server(url) for url in urls]
        self.servers += [Server(p.url, process=p) for p in processes]
        self.current = base_model  # the version new groups get
        self.adapter_path: Path | None = None
        self.restarts = 0  # started servers restarted
        self.failures = 0  # servers that left routing (died, or refused an adapter)
        self.resent = 0  # requests re-sent to another server after theirs died
        self._closing = threading.Event()  # close(): the probes stop
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
        self._using[version] += 1  # held across re-sends: the version stays loaded
        try:
            for resend in itertools.count():
                try:
                    generation = await self._sample(index, version, prompt_token_ids, params)
                    return dataclasses.replace(generation, server=index, adapter_version=version)
                except ServerFailureError as exc:
                    out = self.servers[index].served is None  # found dead by another request
                    if not out and not await asyncio.to_thread(self._down, index):
                        raise  # it answers: the failure is this request's, not the server's
                    self._lost(index, down=True)
                    if resend == self.request_resends:
                        raise GeneratorError(
                            f"vLLM server {index} died during the request, re-sent "
                            f"{resend} times: {exc}"
                        ) from exc
                    log.warning("vLLM server %d died during a request; re-sending it", index)
                    self.resent += 1
                # the whole turn again, from the same prompt with the same version, elsewhere
                index, version = await self._route(prompt_token_ids, version, resend=True)
        finally:
            self._using[version] -= 1
            if version in self._retired and not self._using[version]:
                await asyncio.to_thread(self._unload, version)
        raise AssertionError("unreachable")

    def idle_seconds(self) -> float:
        """Seconds so far that a server had no request in flight, the mean over the servers
        (the trainer logs each iteration's share: `time/server_idle_*`)."""
        return sum(server.idle_seconds() for server in self.servers) / len(self.servers)

    def stats(self) -> GeneratorStats:
        """The servers' idle time so far (`idle_seconds`), their failures, restarts and the
        requests re-sent after their server died."""
        return GeneratorStats(
            server_idle_s=self.idle_seconds(), server_failures=self.failures,
            server_restarts=self.restarts, requests_resent=self.resent,
        )  # fmt: skip

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
            if server.restarting or server.probing:
                server.wake.set()  # it loads the current version itself before it returns
                continue
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
            self._lost(index, down=index in dead)  # back once it holds the current version
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
        self._closing.set()
        for server in self.servers:
            server.wake.set()
        for server in self.servers:
            if server.client is not None:
                await server.client.close()
                server.client = None
        await asyncio.to_thread(self._stop_all)
        self._admin.close()

    # -- routing ----------------------------------------------------------------------------

    async def _route(
        self, prompt: list[int], wanted: str | None, *, resend: bool = False
    ) -> tuple[int, str]:
        """(server index, version) for `prompt`, sampling `wanted` (None: the current
        version), waiting for a server when none is ready; a `resend` may name a retired
        version that its request still holds loaded."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            self._check_processes()
            version = wanted or self.current
            kept = version in (self.current, self.base_model, *self._live) or resend
            if not kept:
                raise GeneratorError(f"{version} is no longer served (retired: the servers keep "
                                     f"the newest {self.keep_versions} versions)")  # fmt: skip
            ready = {i: version for i, s in enumerate(self.servers) if self._holds(s, version)}
            if ready:
                load = {i: s.in_flight for i, s in enumerate(self.servers)}
                pin = self._router.route(prompt, ready, load)
                return pin.server, pin.version
            if not any(s.restarting for s in self.servers):
                raise GeneratorError(f"no vLLM server serves {version}; {self._states()}")
            if time.monotonic() > deadline:
                raise GeneratorError(
                    f"no vLLM server ready after {self.ready_timeout_s:.0f} s; {self._states()}"
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
                tokenizer=self.tokenizer, text_fallback=False,
            )  # fmt: skip
            server.client_url = server.url
        return server.client

    def _holds(self, server: Server, version: str) -> bool:
        """Whether `server` is in routing and can sample `version` now."""
        if server.served is None or server.restarting:
            return False
        return version == server.served or version == self.base_model or version in server.loaded

    async def _sample(
        self, index: int, version: str, prompt: list[int], params: SamplingParams
    ) -> Generation:
        """One request on server `index`, sampling `version` (its idle time counted)."""
        server = self.servers[index]
        client = await self._client(server)
        server.begin()
        try:
            salt = {"cache_salt": f"{version}-{self._nonce}"}
            return await client.generate(prompt, params, model=version, extra_fields=salt)
        finally:
            server.end()

    def _down(self, index: int) -> bool:
        """Whether server `index` is dead: its process gone (ours) or `/health` unanswered."""
        server = self.servers[index]
        if server.process is not None and not server.process.alive():
            return True
        return not healthy(server.url)

    def _states(self) -> str:
        """Each server's state in one line: `0 http://...: run-v3 (log: ...)`."""
        states = []
        for i, s in enumerate(self.servers):
            state = (
                "restarting" if s.restarting else
                f"out, re-probed every {self.probe_every_s:.0f} s" if s.probing else
                s.served or "down for good"
            )  # fmt: skip
            where = f" (log: {s.process.log_path})" if s.process is not None else ""
            states.append(f"{i} {s.url}: {state}{where}")
        return "servers " + ", ".join(states)

    # -- adapters -----------------------------------------------------------------------------

    def _load_on(self, server: Server, version: str, path: Path | None) -> None:
        """Make `server` serve `version` (the adapter in `path`; None: the base weights)."""
        load_on(self._admin, server.url, version, path)

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
        return admin_post(self._admin, server.url, path, body)

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
                self._lost(index, down=True)

    def _lost(self, index: int, *, down: bool) -> None:
        """Server `index` leaves routing until it holds the current version again: restarted
        in the background when it is ours and `down`, re-probed otherwise."""
        server = self.servers[index]
        with self._lock:
            if server.served is None:
                return  # already out (restarting, re-probed, or gone for good)
            server.served = None
            server.loaded.clear()  # back, it holds only the current version
            self._router.forget_server(index)
            self.failures += 1
            restart = down and server.process is not None
            if restart and not self._claim_restart(index):
                return
            server.probing = not restart
        log.warning("vLLM server %d: %s", index, "restarting" if restart else "re-probing")
        target = self._restart if restart else self._probe
        threading.Thread(target=target, args=(index,), daemon=True).start()

    def _claim_restart(self, index: int) -> bool:
        """Mark server `index` restarting if restarts are left (under `_lock`)."""
        server = self.servers[index]
        if server.restarts >= self.max_restarts:
            log.error("vLLM server %d at %s is out of routing for good", index, server.url)
            return False
        server.restarting, server.restarts = True, server.restarts + 1
        self.restarts += 1
        return True

    def _restart(self, index: int) -> None:
        """Start server `index` again and bring it to the current version before routing."""
        server = self.servers[index]
        assert server.process is not None, f"server {index} is not ours to restart"
        try:
            server.process.start(self.start_timeout_s)
            server.url = server.process.url
            self._readmit(index)
        except GeneratorError as exc:
            log.error("vLLM server %d could not be restarted: %s", index, exc)
            server.process.stop()
            server.restarting = False  # out for good (`_readmit` clears it on success)

    def _probe(self, index: int) -> None:
        """Ask server `index` every `probe_every_s` (sooner after a publication) until it
        answers `/health` and holds the current version; restart it if it is ours and died."""
        server = self.servers[index]
        while not self._closing.is_set():
            server.wake.wait(self.probe_every_s)
            server.wake.clear()
            if self._closing.is_set():
                return
            if server.process is not None and not server.process.alive():
                with self._lock:  # ours, and dead after all: restarted if it may be
                    server.probing, restart = False, self._claim_restart(index)
                if restart:
                    self._restart(index)
                return
            try:
                if not healthy(server.url):
                    raise GeneratorError(f"{server.url} does not answer GET /health")
                self._readmit(index)  # back in routing (it clears `probing`)
                return
            except GeneratorError as exc:
                log.info("vLLM server %d stays out of routing: %s", index, exc)

    def _readmit(self, index: int) -> None:
        """Load the current version on server `index` and return it to routing; a publication
        that lands meanwhile is loaded too (the server never serves an older current)."""
        server = self.servers[index]
        while True:
            with self._lock:
                version, path = self.current, self.adapter_path
            self._load_on(server, version, path)
            with self._lock:
                if self.current == version:
                    server.served, server.loaded = version, {version}
                    server.restarting = server.probing = False  # in routing from now on
                    log.warning("vLLM server %d is back, serving %s", index, version)
                    return

    def _stop_all(self) -> None:
        for server in self.servers:
            if server.process is not None:
                server.process.stop()
