"""The `hf` generator: samples with the training model object itself, with continuous batching
and KV reuse.

Exactly one copy of the weights: the generator runs the policy's own model, so it always
samples from the current learner weights (LoRA included).

1. `generate` checks the prompt and hands the request to one worker thread (the event loop
   stays free); the result comes back to the caller's loop.
2. Continuous batching: the worker keeps up to `max_batch_size` rows decoding. A finished row
   leaves at once and a waiting request joins before the next decode step. Under
   `kv_rows_mb` a request joins only when the rows' keys and values stay within it
   (`DecoderEngine.kv_bytes`); until then it waits, first in first out.
3. KV reuse (`loop/generators/hf/kvcache.py`, `loop/generators/hf/engine.py`): a joining request
   reuses the keys and values earlier requests computed, valid for the current weights only: the
   longest shared prefix of any earlier first-turn prompt (the system message and worked example
   are shared by every rollout, the whole first prompt by a task's K rollouts), or its own
   rollout's cache from the previous turn. It prefills only what is new: the glue and the
   observation; the requests joining in one step are prefilled in one packed forward (their
   new ids in one sequence, attention row by row), so a turn boundary where many rollouts
   come back reads the weights once, not once a rollout. The store holds at most
   `kv_cache_mb` (unset: a share of the GPU's free memory, or 1 GiB on a CPU), least recently
   used first out; nothing is kept of a rollout's last turn (`SamplingParams.last_turn`).
   A first-turn prompt becomes a prefix entry of its own only when no entry covers at least
   `SHARE_FRACTION` of it; otherwise it views that entry and its few own tokens (the task) go
   to its row. So the rollouts of many tasks view one entry, whose keys each decode step reads
   once for all of them (1.3x the tokens/s of one entry per task at 72 rows over 36 tasks,
   benchmarks/bench_prefix_sharing.py).
4. Stale keys are never used: before each step the worker compares a fingerprint of the weights
   (every parameter's storage and in-place version counter, which optimizer steps and
   `load_adapter` bump) with the last one; on a change it drops the store and recomputes the
   active rows' caches under the new weights.
5. Our own sampling treats each row with its own temperature, top_p, stop ids and seed, so each
   log-prob is exactly `log q(token)` under the distribution sampled from (log-softmax of
   logits / temperature, renormalised over the top-p nucleus). At temperature 0 (greedy) it is
   the model's log-prob at temperature 1. A row ends at its first sampled stop id (kept) or at
   `max_new_tokens`; nothing after the stop id is returned.

Models the engine does not run (`engine.supports`), and `kv_reuse=False`, take the reference
path: static batches through the plain transformers forward (`sample_batch`), where requests
arriving during a batch wait for the next. A request whose prefill fails gets a
`GeneratorError` alone (on the static path: each request of a failed batch is retried alone);
so does one whose row slots cannot grow to its prompt plus `max_new_tokens` (reserved when it
joins, so decode steps never grow them; never past `max_context_tokens`: a request's
`max_new_tokens` is cut to the room its prompt leaves); a failing decode step fails the rows in
it; the worker keeps serving. The slots' memory is freed whenever no row is active; the C heap's
free pages go back to the OS as a burst starts and in `release_memory` (`pages.trim_heap`). The
model is in eval mode under `torch.no_grad()` while sampling; each module's training flag is
restored afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from loop.config_types import one_line
from loop.generators.base import (
    EngineWork,
    FinishReason,
    Generation,
    GeneratorError,
    GeneratorStats,
    SamplingParams,
)
from loop.generators.hf.admission import Admission
from loop.generators.hf.engine import DecoderEngine, Row, supports
from loop.generators.hf.kvcache import KVStore
from loop.generators.hf.listing import ModelListing, sampling_mode
from loop.generators.hf.memory import PACKED_PREFILL_IDS, kv_cache_budget_mb, pack_prefills
from loop.generators.hf.pages import trim_heap
from loop.generators.hf.requests import Active, Request, capped, check_prompt, deliver
from loop.generators.hf.sampling import pick_tokens, sample_batch, seeded_rng
from loop.model.checkpoint import load_adapter
from loop.model.policy import Policy

# A first-turn prompt views an existing prefix entry instead of becoming one when the entry
# covers at least this share of it (see the module docstring, step 3).
SHARE_FRACTION = 0.5


class HFGenerator:
    """An async sampler over the policy's own model (see the module docstring)."""

    name = "hf"
    shares_weights = True  # it samples with the policy the learner trains
    version = "policy"  # the live weights: nothing is published, so one name for all of them

    def __init__(
        self,
        policy: Policy,
        *,
        max_batch_size: int = 8,
        kv_reuse: bool = True,
        kv_cache_mb: float | None = None,
        kv_rows_mb: float | None = None,
        torch_threads: int | None = None,
        max_context_tokens: int | None = None,
        batch_wait_s: float = 0.01,
        share_fraction: float = SHARE_FRACTION,
    ):
        if kv_cache_mb is None:
            kv_cache_mb = kv_cache_budget_mb(policy.device)
        if (
            max_batch_size < 1
            or batch_wait_s < 0
            or kv_cache_mb < 0
            or (kv_rows_mb is not None and kv_rows_mb <= 0)
            or (torch_threads or 1) < 1
            or (max_context_tokens or 2) < 2
        ):
            raise ValueError(
                f"bad hf generator settings: max_batch_size={max_batch_size}, "
                f"kv_cache_mb={kv_cache_mb}, kv_rows_mb={kv_rows_mb}, "
                f"torch_threads={torch_threads}, "
                f"batch_wait_s={batch_wait_s}, max_context_tokens={max_context_tokens}"
            )
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.share_fraction = share_fraction  # 1.0: every first-turn prompt its own entry
        self.torch_threads = torch_threads  # torch's CPU threads while sampling (None: as is)
        self.max_context_tokens = max_context_tokens  # a row's prompt + output at most
        self.batches_run = 0  # forward batches: prefills and decode steps
        self.requests_served = 0
        self.tokens_generated = 0
        self.work = EngineWork()
        self.cache = KVStore(int(kv_cache_mb * 2**20))
        bound = None if kv_rows_mb is None else int(kv_rows_mb * 2**20)
        self.admission = Admission(batch_wait_s, bound)  # the inbox and the waiting line
        self.engine = (
            DecoderEngine(policy.model, max_rows=max_batch_size, max_tokens=max_context_tokens)
            if kv_reuse and supports(policy.model)
            else None
        )
        self._vocab_size = policy.model.get_input_embeddings().num_embeddings
        self._pad_id = _pad_token_id(policy)
        self._model_lock = threading.Lock()  # one user of the weights at a time (load_adapter)
        self._active: list[Active] = []
        self._outbox: list[tuple[Request, Generation | Exception]] = []  # delivered after a step
        self._fingerprint: tuple[tuple[int, int], ...] | None = None
        self._listing: ModelListing | None = None  # listed at a burst's start (ModelListing)
        self._worker: threading.Thread | None = None
        self._closed = False

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """Sample one continuation of `prompt_token_ids` (`messages` is ignored)."""
        if self._closed:
            raise GeneratorError("hf generator is closed")
        check_prompt(prompt_token_ids, self._vocab_size)
        params = capped(len(prompt_token_ids), params, self.max_context_tokens)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        self._ensure_worker()
        self.admission.inbox.put(Request(list(prompt_token_ids), params, future, loop))
        return await future

    def load_adapter(self, path: Path | None) -> None:
        """None: no-op (the learner trains this very model, so its weights are already current).

        A path: copy that peft adapter directory's LoRA weights into the policy's peft model,
        which is also the learner's model (one copy). Waits for a running step to finish; the
        weights' fingerprint then changes, so no cached keys of the old weights are used.
        """
        if path is None:
            return
        if not self.policy.is_lora:
            raise ValueError("load_adapter(path) needs a LoRA policy: load_policy(..., lora=...)")
        with self._model_lock:
            load_adapter(self.policy.model, Path(path))
            self._listing = None  # listed again before the next step

    def release_memory(self) -> None:
        """Drop the KV store and, when no row is active, free the row slots: the learner's step
        gets that memory, and the next step changes the weights, which would void the store
        anyway. Waits for a running decode step."""
        with self._model_lock:
            self.cache.invalidate()
            if self.engine is not None:
                self.engine.unpack()  # packed weight copies, remade on the next step
                if not self.engine.rows:
                    self.engine.release()
            trim_heap()  # what was freed goes back to the OS, for the learner's step

    def stats(self) -> GeneratorStats:
        """The engine's decode and prefill work so far (a copy: the worker keeps counting)."""
        return GeneratorStats(engine=dataclasses.replace(self.work))

    async def close(self) -> None:
        """Stop the worker; queued and running requests get a `GeneratorError`."""
        self._closed = True
        self.admission.inbox.put(None)
        worker, self._worker = self._worker, None
        if worker is not None:
            await asyncio.to_thread(worker.join, 30)

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="hf-generator", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        """The worker thread: serve until `close` (then fail whatever is left)."""
        try:
            while not self._closed:
                if self.engine is None:
                    batch = self.admission.take(self.max_batch_size, block=True, static=True)
                    self._serve_static(batch)
                    continue
                room, idle = self.max_batch_size - len(self._active), not self._active
                joining = self.admission.take(room, block=idle, static=False)
                try:
                    self._serve_continuous(joining)
                except Exception as exc:  # a fault of ours: fail what is in flight, keep serving
                    self._fail_in_flight(
                        joining, f"hf generation failed: {one_line(exc, typed=True)}"
                    )
        finally:
            self._fail_in_flight([], "hf generator closed")

    def _fail_in_flight(self, requests: list[Request], message: str) -> None:
        """`requests` and every active row get a `GeneratorError`; all row slots are freed."""
        error = GeneratorError(message)
        waiting = self.admission.drain()
        for request in [*requests, *waiting, *(active.request for active in self._active)]:
            deliver(request, error)
        self._active = []
        if self.engine is not None:
            self.engine.rows.clear()
            self.engine.release()

    def _serve_continuous(self, joining: list[Request]) -> None:
        """Admit `joining`, then one decode step for every active row. Results are delivered
        once the model is back in its own mode (a caller may train it as soon as it has them)."""
        assert self.engine is not None
        if not self._active:  # a burst starts: what the learner freed goes back first
            trim_heap()
        try:  # the listing is taken under the lock (`with A, B` enters A before evaluating B)
            with self._model_lock, sampling_mode(self._current_listing(), self.torch_threads):
                self._sync_weights()
                placed = []
                for request in joining:  # room for its keys and values (loop/.../admission.py)
                    room = self.admission.room(request, self.engine, self.cache)
                    if room == "wait":
                        self.admission.wait(request)
                    elif room == "yes":
                        placed.append(self._admit(request))
                    elif isinstance(room, Exception):  # it could not fit alone
                        self._outbox.append((request, room))
                self._prefill_joined([entry for entry in placed if entry is not None])
                for active in [a for a in self._active if a.request.future.done()]:  # cancelled
                    self._leave(active, retain=False)
                if self._active:
                    self._decode_step()
                if not self._active:  # the slots' memory back until rows come again
                    self.engine.release()
        finally:
            outbox, self._outbox = self._outbox, []
            for request, outcome in outbox:
                deliver(request, outcome)

    def _current_listing(self) -> ModelListing:
        """The model's modules and parameters for this step (under the model lock): listed
        again when a burst of work starts (no row active) or after `load_adapter`."""
        if self._listing is None or not self._active:
            self._listing = ModelListing.of(self.policy.model)
        return self._listing

    def _sync_weights(self) -> None:
        """Drop every cached key of old weights; recompute the active rows' caches."""
        assert self.engine is not None and self._listing is not None
        listing = self._listing
        fingerprint = listing.fingerprint()
        if fingerprint == self._fingerprint:
            return
        self.engine.refresh()  # the fused projections re-read the weights (may rebind views)
        self.engine.drop()  # packed now, the plain copies' pages back until release_memory
        fingerprint = listing.fingerprint()
        if self._fingerprint is not None:
            self.cache.invalidate()
            for active in self._active:
                row, ids = active.row, active.row.ids
                row.ids, row.entry, row.n_prefix = [], None, 0
                self.engine.prefill(row, ids)
        self._fingerprint = fingerprint

    def _admit(self, request: Request) -> tuple[Active, list[int]] | None:
        """Give a request a row: reuse what the store has; the ids left to prefill.

        A prompt that extends no retained cache (a rollout's first turn) and that no entry
        covers for `share_fraction` of its length becomes a prefix entry, so later prompts can
        view it: it is prefilled here, outside the row slots, and its first token sampled
        (None returned). Any other request gets its slot, with room for all it will hold (so
        no decode step grows the slots), and is returned with its new ids for
        `_prefill_joined`. A request that fails here gets its error alone.
        """
        assert self.engine is not None
        prompt = request.prompt_token_ids
        match = self.cache.match(prompt)
        row = Row(ids=prompt[: match.reused], entry=match.entry, n_prefix=match.n_prefix)
        active = Active(request, row, seeded_rng(request.params.seed))
        shared = (
            not match.from_retained
            and match.reused < len(prompt) - 1
            and match.reused < self.share_fraction * len(prompt)
        )
        new_tokens = request.params.max_new_tokens
        try:
            if not shared:
                row.reserved = len(prompt) - row.n_prefix + new_tokens
                self.engine.reserve(row.reserved)
                self.engine.add(row, match.own)
                return active, prompt[match.reused :]
            store = self.engine.new_store(len(prompt) - match.reused)
            started = time.perf_counter()
            logits = self.engine.prefill(row, prompt[match.reused :], store=store)
            self._count_prefill(started, len(prompt) - match.reused)
            own = self._share_prompt(row, store)
            # room for all the row will hold before its keys go in: one growth, not two
            row.reserved = row.own_length + new_tokens
            self.engine.reserve(row.reserved)
            self.engine.add(row, own)
        except Exception as exc:
            self._refuse(active, exc)
            return None
        self._joined([active], logits[None])
        return None

    def _prefill_joined(self, placed: list[tuple[Active, list[int]]]) -> None:
        """Prefill the rows that joined this step and sample their first tokens: those whose new
        ids fit one prefill chunk in packed forwards of up to `PACKED_PREFILL_IDS` ids
        (`DecoderEngine.prefill_rows`), longer ones alone in chunks. If a packed forward fails,
        each of its rows is tried alone, so only a row that fails alone gets an error."""
        assert self.engine is not None
        sizes = [len(ids) for _, ids in placed]
        packs = pack_prefills(sizes, self.engine.prefill_chunk, PACKED_PREFILL_IDS)
        groups = [[placed[i] for i in pack] for pack in packs]
        while groups:
            group = groups.pop(0)
            actives = [active for active, _ in group]
            started = time.perf_counter()
            try:
                if len(group) == 1:
                    logits = self.engine.prefill(actives[0].row, group[0][1])[None]
                else:
                    logits = self.engine.prefill_rows(
                        [a.row for a in actives], [i for _, i in group]
                    )
            except Exception as exc:
                if len(group) > 1:
                    groups = [[entry] for entry in group] + groups
                else:
                    self._refuse(actives[0], exc)
                continue
            self._count_prefill(started, sum(len(ids) for _, ids in group))
            self._joined(actives, logits)

    def _count_prefill(self, started: float, tokens: int) -> None:
        self.work.prefill_s += time.perf_counter() - started
        self.work.prefill_tokens += tokens

    def _refuse(self, active: Active, exc: Exception) -> None:
        """A joining request that failed: its slot freed, its error delivered."""
        assert self.engine is not None
        if active.row.slot >= 0:
            self.engine.remove(active.row, keep=False)
        error = GeneratorError(f"hf generation failed: {one_line(exc, typed=True)}")
        self._outbox.append((active.request, error))

    def _joined(self, actives: list[Active], logits: Tensor) -> None:
        """Rows whose prompts are prefilled: they become active and sample their first token."""
        self._active.extend(actives)
        self.batches_run += 1
        self._pick(actives, logits)

    def _share_prompt(self, row: Row, own: Tensor) -> Tensor | None:
        """Keep `row`'s whole prompt as a prefix entry viewed by the row (its own KV then
        empty); `own` stays the row's if the entry does not fit the store's budget."""
        kv = (
            own if row.entry is None else torch.cat([row.entry.kv[:, :, :, : row.n_prefix], own], 3)
        )
        entry = self.cache.add_entry(row.ids, kv)
        if entry is None:
            return own
        row.entry, row.n_prefix = entry, len(row.ids)
        return None

    def _decode_step(self) -> None:
        assert self.engine is not None
        self._active.sort(key=lambda active: active.row.slot)  # a leaving row's slot was refilled
        rows = [active.row for active in self._active]
        started = time.perf_counter()
        try:
            logits = self.engine.decode(rows, [active.sampled[-1] for active in self._active])
        except Exception as exc:
            error = GeneratorError(f"hf generation failed: {one_line(exc, typed=True)}")
            for active in list(self._active):
                self._leave(active, retain=False)
                self._outbox.append((active.request, error))
            return
        self.batches_run += 1
        self._pick(list(self._active), logits)
        self.work.decode_s += time.perf_counter() - started
        self.work.decode_steps += 1
        self.work.decoded_rows += len(rows)

    def _pick(self, actives: list[Active], logits: Tensor) -> None:
        """Sample each row's next token; finished rows leave and get their result."""
        finish: list[FinishReason | None] = [None for _ in actives]
        pick_tokens(
            logits,
            [a.request.params for a in actives],
            [a.rng for a in actives],
            [a.sampled for a in actives],
            [a.logprobs for a in actives],
            finish,
        )
        for active, reason in zip(actives, finish, strict=True):
            if reason is None:
                continue
            self._leave(active, retain=not active.request.params.last_turn)
            self.requests_served += 1
            self.tokens_generated += len(active.sampled)
            result = Generation(active.sampled, active.logprobs, reason)
            self._outbox.append((active.request, result))

    def _leave(self, active: Active, *, retain: bool) -> None:
        """Free the row's slot; keep its cache for the rollout's next turn if `retain`."""
        assert self.engine is not None
        self._active.remove(active)
        own = self.engine.remove(active.row, keep=retain)
        if own is not None:
            row = active.row
            self.cache.retain(row.ids, row.entry, row.n_prefix, own)

    def _serve_static(self, batch: list[Request]) -> None:
        """The reference path: one static batch, each request retried alone if it fails."""
        if not batch:
            return
        for request, outcome in zip(batch, self._serve(batch), strict=True):
            deliver(request, outcome)

    def _serve(self, batch: list[Request]) -> list[Generation | GeneratorError]:
        """The batch at once; if that fails, each request alone."""
        try:
            return list(self._sample_batch(batch))
        except Exception as exc:
            if len(batch) == 1:
                return [GeneratorError(f"hf generation failed: {one_line(exc, typed=True)}")]
        return [outcome for request in batch for outcome in self._serve([request])]

    def _sample_batch(self, batch: list[Request]) -> list[Generation]:
        listing = ModelListing.of(self.policy.model)
        with self._model_lock, sampling_mode(listing, self.torch_threads):
            generations = sample_batch(
                self.policy.model,
                [request.prompt_token_ids for request in batch],
                [request.params for request in batch],
                pad_token_id=self._pad_id,
                device=self.policy.device,
            )
        self.batches_run += 1
        self.requests_served += len(batch)
        self.tokens_generated += sum(len(g.token_ids) for g in generations)
        return generations


def _pad_token_id(policy: Policy) -> int:
    """Padded positions are masked, so any id works; the tokenizer's pad (or eos) id if any."""
    pad = getattr(policy.tokenizer, "pad_token_id", None)
    pad = getattr(policy.tokenizer, "eos_token_id", None) if pad is None else pad
    return int(pad) if pad is not None else 0
