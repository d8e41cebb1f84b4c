"""The `vllm_server` generator: N vLLM OpenAI servers, trained through versioned LoRA adapters.

The topology of apple/ml-loop, TRL's server mode, prime-rl, SkyRL, AReaL: inference in server
processes on devices of their own; rank 0 talks to them over HTTP. Servers are started here
(vllm/process.py: clean environment, own devices, loopback, ended with the trainer; `close()`
stops them for good, a restart under way too) or attached by URL (`generator.servers`). Token
in, token out (openai.py). Routing (vllm/routing.py): a task's K rollouts and every later turn
of each go to one server, with one adapter version; new groups to the least loaded.

Versions. `load_adapter(path)` publishes a new adapter on every server at once under a name
never used before, `<prefix>-v<k>` (the prefix: the run's name and its adapter nonce, kept in
the run directory, so two runs named alike never share a name, and a resumed run unloads what
its earlier life left on an attached server); a name a server holds that we did not send it
is an error, never replaced. A load (`POST /v1/load_lora_adapter`; a 404 retried for a shared
filesystem slow to show the files) counts once `GET /v1/models` lists it; only then does the
version become current (new groups pin it); until a server confirms it, they pin the previous
one. A request's `cache_salt` is its version (plus this trainer's nonce): no prefix-cache block
computed under other weights is reused (vllm#42125). A server that fails to load leaves
routing (never serves a mixed version) and is re-probed. The newest `keep_versions` stay
loaded (S + 1 when collecting S iterations ahead, `train.overlap.max_staleness`): every turn
of a group samples the version it was pinned to (`SamplingParams.version`); an older one is
unloaded once no request uses it, and a request naming it fails (`GeneratorError`).

Failures. A server that dies or stops costs only time. Every `probe_every_s` each server in
routing is asked `GET /health` (within `health_timeout_s`) and whether it lists its version.
One that died or stopped answering leaves routing: a started one is killed and restarted in
the background (up to `max_restarts` times), an attached one re-probed every `probe_every_s`
and at each publication; one that lost its adapters (restarted by its owner, seen then or in a
request's 404) gets the newest loaded at once. Each returns only once it holds the newest
version (loaded and listed). A request whose server failed under it (no connection, a reset, a
timeout: `ServerFailureError`, the server then found down; a 404 for a version it lost; or its
server left routing meanwhile) is re-sent whole, same prompt and version, to a server holding
it, up to `request_resends` times: the trajectory stays token exact. With no server ready, a
request waits up to `ready_timeout_s` for one restarted or re-probed; with none coming back it
fails at once, in one line naming each server, its state and its log.
`stats()` counts failures, stalls, restarts, republications and re-sent requests (`servers/*`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from loop.generators.base import Generation, GeneratorError, GeneratorStats, SamplingParams
from loop.generators.openai import OpenAIGenerator, ServerFailureError
from loop.generators.tokenizer import Tokenizer
from loop.generators.vllm.endpoint import (
    LOAD_RETRIES,
    LOAD_RETRY_S,
    PUBLISH_TIMEOUT_S,
    Server,
    admin_post,
    clear_leftovers,
    load_on,
    states,
)
from loop.generators.vllm.process import ServerProcess, healthy, start_together, stop_for_good
from loop.generators.vllm.routing import PrefixRouter

log = logging.getLogger(__name__)
# Servers are asked again this often: the 404 window of a load (LOAD_RETRIES x LOAD_RETRY_S),
# so a filesystem slow to show the files is not waited on longer than it took to give up on it.
PROBE_EVERY_S = LOAD_RETRIES * LOAD_RETRY_S
WATCH_REQUEST_S = 1.0  # how often a request in flight looks whether its server left routing
REQUEST_RESENDS = 2  # a request re-sent after its server died: at most on two more servers
HEALTH_TIMEOUT_S = 30.0  # a server that does not answer GET /health this long has stopped


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
        publish_timeout_s: float = PUBLISH_TIMEOUT_S,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        max_concurrency: int = 256,
        max_restarts: int = 3,
        keep_versions: int = 1,
        probe_every_s: float = PROBE_EVERY_S,
        request_resends: int = REQUEST_RESENDS,
        tokenizer: Tokenizer | None = None,
    ):
        """Start `processes` (in parallel) and attach to `urls`; `GeneratorError` when a started
        server fails (its cause in one line) or an attached one does not answer `/health`.

        `base_model`: the base weights' name; `adapter_prefix`: the stem of every version's
        name (the run's name and nonce); `keep_versions`: the newest versions kept loaded (the
        servers' `--max-loras` must hold them); `probe_every_s`: how often a server is asked
        whether it answers and holds its version; `request_resends`: how many other servers a
        request whose server died is re-sent to; `request_timeout_s`, `publish_timeout_s`,
        `health_timeout_s`: the longest wait for a completion, a load and a health probe;
        `tokenizer`: the policy's, every answer is checked against it (generators/validate.py)."""
        if not processes and not urls:
            raise ValueError("the vllm_server generator needs servers to start or URLs")
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.keep_versions = keep_versions
        self.base_model, self.adapter_prefix = base_model, adapter_prefix
        self._prefix = f"{adapter_prefix}-v"  # every version's name starts so
        self.start_timeout_s, self.request_timeout_s = start_timeout_s, request_timeout_s
        # a request waits for a server coming back as long as a start may take (None)
        self.ready_timeout_s = start_timeout_s if ready_timeout_s is None else ready_timeout_s
        self.max_restarts, self.probe_every_s = max_restarts, probe_every_s
        self.request_resends, self.health_timeout_s = request_resends, health_timeout_s
        self.max_concurrency, self.tokenizer = max_concurrency, tokenizer
        self.servers = [Server(url) for url in urls] + [Server(p.url, process=p) for p in processes]
        self.current = base_model  # the version new groups get: one a server confirmed
        self.adapter_path: Path | None = None
        # the newest published version, which servers coming back load (current once confirmed)
        self.target: tuple[str, Path | None] = (base_model, None)
        self.restarts = 0  # started servers restarted
        self.failures = 0  # servers that left routing (died, stopped, refused an adapter)
        self.stalls = 0  # servers that stopped answering their health probe (left routing)
        self.republished = 0  # servers that lost their adapters (restarted by their owner)
        self.resent = 0  # requests re-sent to another server after theirs died
        self._closing = threading.Event()  # close(): the probes stop
        self._nonce = secrets.token_hex(4)  # this trainer's cache salts differ from any other's
        self._versions = itertools.count(1)
        self._using: Counter[str] = Counter()  # requests in flight per version
        self._retired: set[str] = set()  # versions to unload once no request uses them
        self._live: list[str] = []  # the adapter versions kept loaded, oldest first
        self._router = PrefixRouter()
        self._lock = threading.Lock()  # server state, shared with the restart threads
        self._threads: list[threading.Thread] = []  # the watcher, restarts and re-probes
        self._admin = httpx.Client(timeout=publish_timeout_s)
        try:
            start_together(processes, start_timeout_s)
        except BaseException:
            self._stop_all()
            raise
        for server in self.servers:
            server.url = server.process.url if server.process is not None else server.url
            if server.process is None and not healthy(server.url):
                self._stop_all()
                raise GeneratorError(f"no vLLM server answers at {server.url} (generator.servers)")
            if server.process is None:
                clear_leftovers(self._admin, server.url, self._prefix)
            server.served = base_model
        self._background(self._watch)

    @property
    def version(self) -> str:
        """The version new groups sample: the newest a server confirmed (the base before any)."""
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
                    down = self.servers[index].down
                    if not out and not await asyncio.to_thread(down, self.health_timeout_s):
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
            server_stalls=self.stalls, adapters_republished=self.republished,
        )  # fmt: skip

    def load_adapter(self, path: Path | None) -> None:
        """Publish the adapter in `path` (None: the base weights) as a new version on every
        server (in parallel); new groups sample from it once a server confirmed it, the
        previous version until then (see the module docstring)."""
        version = f"{self._prefix}{next(self._versions)}" if path else self.base_model
        path = Path(path).resolve() if path else None
        with self._lock:
            previous_target, self.target = self.target, (version, path)
        serving = [i for i, s in enumerate(self.servers) if not (s.restarting or s.probing)]
        for server in self.servers:  # one out of routing loads the target itself, woken now
            server.wake.set()

        def load(index: int) -> tuple[str, bool] | None:  # None, or why not and if it is down
            try:
                self._load_on(self.servers[index], version, path)
            except GeneratorError as exc:
                return str(exc), self.servers[index].down(self.health_timeout_s)
            return None

        with ThreadPoolExecutor(max(1, len(serving))) as pool:
            outcomes = dict(zip(serving, pool.map(load, serving), strict=True))
        loaded = [i for i, outcome in outcomes.items() if outcome is None]
        failures = {i: o for i, o in outcomes.items() if o is not None and not o[1]}
        dead = {i: o for i, o in outcomes.items() if o is not None and o[1]}
        with self._lock:
            if failures and not loaded and not dead and self.current != version:
                self.target = previous_target  # the adapter's fault: the servers keep serving
                raise GeneratorError(f"no vLLM server loaded {version}: "
                                     f"{'; '.join(o[0] for o in failures.values())}")  # fmt: skip
            for index in loaded:
                server = self.servers[index]
                if server.served is not None:  # still in routing (not lost meanwhile)
                    server.served = version
                    server.loaded.add(version)
            if loaded:
                self.current, self.adapter_path = version, path
        for index, (failure, down) in (failures | dead).items():
            log.warning("vLLM server %d leaves routing: %s", index, failure)
            self._lost(index, down=down)  # back once it holds the target version
        self._live = [v for v in self._live if v != version] + [version] * (path is not None)
        while len(self._live) > self.keep_versions:  # the oldest leave once no request uses them
            old = self._live.pop(0)
            self._retired.add(old)
            if not self._using[old]:
                self._unload(old)

    def release_memory(self) -> None:
        """Nothing: the servers' memory is not the learners'."""

    async def close(self) -> None:
        """Close the clients, stop the servers started here, unload our adapters from the rest."""
        self._closing.set()
        for server in (s for s in self.servers if s.process is None and s.served is not None):
            with contextlib.suppress(GeneratorError):  # best effort: a resume clears the rest
                await asyncio.to_thread(clear_leftovers, self._admin, server.url, self._prefix)
        for server in self.servers:
            server.wake.set()
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
            version, base = wanted or self.current, self.base_model
            kept = version in (self.current, base, *self._live) or resend
            if not kept:
                raise GeneratorError(f"{version} is no longer served (retired: the servers keep "
                                     f"the newest {self.keep_versions} versions)")  # fmt: skip
            ready = {i: version for i, s in enumerate(self.servers) if s.holds(version, base)}
            if ready:
                load = {i: s.in_flight for i, s in enumerate(self.servers)}
                pin = self._router.route(prompt, ready, load)
                return pin.server, pin.version
            late = time.monotonic() > deadline
            if late or not any(s.restarting or s.probing for s in self.servers):
                why = f"ready after {self.ready_timeout_s:.0f} s" if late else f"serves {version}"
                listing = states(self.servers, self.probe_every_s)
                raise GeneratorError(f"no vLLM server {why}; {listing}")
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

    async def _sample(
        self, index: int, version: str, prompt: list[int], params: SamplingParams
    ) -> Generation:
        """One request on server `index`, sampling `version` (its idle time counted)."""
        server = self.servers[index]
        client = await self._client(server)
        outages = server.outages
        server.begin()
        salt = {"cache_salt": f"{version}-{self._nonce}"}
        request = asyncio.ensure_future(
            client.generate(prompt, params, model=version, extra_fields=salt)
        )
        try:
            while not (await asyncio.wait({request}, timeout=WATCH_REQUEST_S))[0]:
                if server.outages != outages:  # it left routing (stopped answering): fail over
                    raise ServerFailureError(f"{server.url} left routing during the request")
            return request.result()
        except GeneratorError as exc:  # a 404 for a version it no longer lists: fail over
            lost = " answered 404" in str(exc) and not isinstance(exc, ServerFailureError)
            if lost and await asyncio.to_thread(server.forgot, self._admin, version):
                self._republish(index, version)
                raise ServerFailureError(f"{server.url} lost {version}: {exc}") from exc
            raise
        finally:
            request.cancel()
            server.end()

    # -- adapters -----------------------------------------------------------------------------

    def _load_on(self, server: Server, version: str, path: Path | None) -> None:
        """Make `server` serve `version` (the adapter in `path`; None: the base weights)."""
        load_on(self._admin, server.url, version, path, server.sent)

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

    def _check_processes(self) -> None:
        """Take servers whose process died out of routing (and restart them)."""
        for index, server in enumerate(self.servers):
            process = server.process
            if process is not None and server.served is not None and not process.alive():
                self._lost(index, down=True)

    def _lost(self, index: int, *, down: bool, holding: str | None = None) -> bool:
        """Server `index` leaves routing until it holds the current version again: restarted
        in the background when it is ours and `down`, re-probed otherwise; with `holding`,
        only if we did not unload that version since it was seen missing. Whether it left."""
        server = self.servers[index]
        with self._lock:
            unloaded = holding is not None and holding not in server.loaded  # `loaded` first
            if server.served is None or self._closing.is_set() or unloaded:
                return False  # already out (restarting, re-probed, gone for good), or closing
            server.served = None
            server.outages += 1  # its requests in flight fail over
            server.loaded.clear()  # back, it holds only the target version
            self._router.forget_server(index)
            self.failures += 1
            restart = down and server.process is not None
            if restart and not self._claim_restart(index):
                return True
            server.probing = not restart
        log.warning("vLLM server %d: %s", index, "restarting" if restart else "re-probing")
        self._background(self._restart if restart else self._probe, index)
        return True

    def _claim_restart(self, index: int) -> bool:
        """Mark server `index` restarting if restarts are left (under `_lock`)."""
        server = self.servers[index]
        if self._closing.is_set():
            return False
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
                if not healthy(server.url, self.health_timeout_s):
                    raise GeneratorError(f"{server.url} does not answer GET /health")
                self._readmit(index)  # back in routing (it clears `probing`)
                return
            except GeneratorError as exc:
                log.info("vLLM server %d stays out of routing: %s", index, exc)

    def _readmit(self, index: int) -> None:
        """Load the target on server `index`, then route to it (a publication meanwhile too)."""
        server = self.servers[index]
        while not self._closing.is_set():
            with self._lock:
                version, path = self.target
            self._load_on(server, version, path)
            with self._lock:
                if self.target[0] == version:
                    server.served, server.loaded = version, {version}
                    server.restarting = server.probing = False  # in routing from now on
                    self.current, self.adapter_path = version, path
                    log.warning("vLLM server %d is back, serving %s", index, version)
                    return

    def _watch(self) -> None:
        """Every `probe_every_s`, ask each server in routing whether it answers `/health` and
        lists its version; one that does not leaves routing: a stopped one is restarted (ours)
        or re-probed, one that lost its adapters gets the target loaded before it serves."""
        while not self._closing.wait(self.probe_every_s):
            for index, server in enumerate(self.servers):
                version = server.served
                if version is None or server.restarting or self._closing.is_set():
                    continue
                if server.down(self.health_timeout_s):
                    log.warning("vLLM server %d at %s stopped answering", index, server.url)
                    self.stalls += 1
                    self._lost(index, down=True)
                elif version != self.base_model and server.forgot(self._admin, version):
                    self._republish(index, version)

    def _republish(self, index: int, version: str) -> None:
        """Server `index` lost `version` (restarted by its owner; not if a publication retired
        it meanwhile): out of routing, the newest loaded at once (a woken re-probe) first."""
        if self._lost(index, down=False, holding=version):
            log.warning("vLLM server %d lost %s: loading the newest again", index, version)
            self.republished += 1
            self.servers[index].wake.set()

    def _background(self, target: Callable[..., None], *args: int) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:  # the ended ones leave (started, so an ident, and no longer alive)
            live = [t for t in self._threads if t.ident is None or t.is_alive()]
            self._threads[:] = [*live, thread]
        thread.start()

    def _stop_all(self) -> None:  # no restart thread outlives it
        stop_for_good([s.process for s in self.servers if s.process is not None], self._threads)
