"""One `vllm` OpenAI server as a child process: started clean, watched, stopped for good.

The server backend (loop/generators/vllm/server.py) samples through vLLM's own OpenAI server,
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script breaks with the CPU
package's name), which it starts here or finds at a given URL. What a started server gets:
- the environment without the launcher's variables (loop/generators/vllm/launch_env.py: under
  torchrun its workers would otherwise join the learners' rendezvous or take their GPUs), its
  own GPUs (`CUDA_VISIBLE_DEVICES`) or, on CPU, its own cores (`VLLM_CPU_OMP_THREADS_BIND`),
  and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1` for `/v1/load_lora_adapter`;
- a loopback address, a session (process group) of its own, and a `Lifeline`: when the trainer
  ends, however it ends (Ctrl-C, an exception, SIGKILL), the server and its engine end too;
- its output in a log file; a start-up failure is one line naming the cause found there (the
  port taken, the model missing, out of memory) and the log's path.
Two of its arguments are worked out here, for loop/build.py's `vllm_server_args`: on CPU no
prompt split across engine steps (`whole_prompts`), and a converted model's stale GGUF
`quantization_config` hidden (`stale_gguf_override`).

    server = ServerProcess(["--model", path, ...], port=0, log_path=run / "servers/0.log")
    server.start(timeout_s=600)          # returns once GET /health answers 200
    server.url                           # http://127.0.0.1:<port>/v1
    server.alive()                       # False once it has died
    server.stop()                        # SIGTERM to its group, SIGKILL after a grace period
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from loop.generators.base import GeneratorError
from loop.generators.vllm.launch_env import launcher_free
from loop.generators.vllm.lifeline import Lifeline

log = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HOST = "127.0.0.1"  # loopback only: the server has no authentication
POLL_S = 1.0
STOP_GRACE_S = 20.0
LOG_TAIL_BYTES = 64_000

# What a failed start-up's log says, and how we say it (first match wins).
CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"address already in use|errno 98", re.I), "port {port} is taken"),
    (  # vllm-cpu's and vLLM's words for a KV cache that the memory share cannot hold
        re.compile(
            r"less than requested memory for kv|no available memory for the cache blocks|"
            r"larger than the maximum number of tokens that can be stored in kv cache",
            re.I,
        ),
        "too little memory for the KV cache: raise generator.gpu_memory_utilization or lower "
        "generator.max_model_len",
    ),
    (
        re.compile(r"out of memory|outofmemory|cannot allocate memory|insufficient memory", re.I),
        "out of memory",
    ),
    (
        re.compile(r"died unexpectedly \(exit code: -9\)|exit code -9|killed", re.I),
        "a server process was killed (SIGKILL: out of memory? lower gpu_memory_utilization)",
    ),
    (
        re.compile(
            r"no such file or directory|does not appear to have|not a valid model|"
            r"repository ?not ?found|can't load the configuration|no config file|"
            r"is not a local folder|repo id must be",
            re.I,
        ),
        "the model is missing or unreadable",
    ),
    (re.compile(r"no module named 'vllm|no module named vllm", re.I), "vLLM is not installed"),
)


class ServerProcess:
    """A `vllm` OpenAI server this process starts and owns (see the module docstring)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        port: int = 0,
        log_path: Path,
        devices: Sequence[int] = (),
        on_gpu: bool = False,
        extra_env: Mapping[str, str] | None = None,
        name: str = "vLLM server",
        module: str = SERVER_MODULE,
    ):
        """`args`: the server's arguments without `--host`/`--port` (set here). `port` 0: a free
        one, chosen at each start. `devices`: GPU indices (`on_gpu`) or CPU core ids. `module`:
        the server's Python module (`python -m module`)."""
        self.args, self.requested_port, self.module = list(args), port, module
        self.log_path, self.devices, self.on_gpu = Path(log_path), list(devices), on_gpu
        self.extra_env, self.name = dict(extra_env or {}), name
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None
        self._lifeline: Lifeline | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """The server's OpenAI base URL (ends in /v1)."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self) -> list[str]:
        """The command line of the next start."""
        where = ["--host", HOST, "--port", str(self.port)]
        return [sys.executable, "-m", self.module, *self.args, *where]

    def environment(self) -> dict[str, str]:
        """The server's environment: ours without the launcher's variables, its own devices."""
        env = launcher_free(os.environ, self.devices if self.on_gpu else None)
        if self.devices and not self.on_gpu:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(core) for core in self.devices)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        return env | self.extra_env

    def start(self, timeout_s: float) -> None:
        """Launch the server and wait until it answers `GET /health`; `GeneratorError` (one
        line: the cause found in its log, and the log's path) if it exits or times out."""
        self.stop()
        self.port = self.requested_port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.starts + 1}: {' '.join(self.command())}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command(), env=self.environment(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        process = self._process
        self._lifeline = Lifeline([process.pid])
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not process:
                raise GeneratorError(f"{self.name} was stopped while starting")
            if process.poll() is not None:
                self.stop()
                raise GeneratorError(
                    f"{self.name} exited ({process.returncode}) while starting: {self.cause()}"
                )
            if healthy(self.url):
                return
            time.sleep(POLL_S)
        self.stop()
        raise GeneratorError(
            f"{self.name} not ready after {timeout_s:.0f} s (generator.server_start_timeout_s): "
            f"{self.cause()}"
        )

    def alive(self) -> bool:
        """True while the process runs (it may still be starting)."""
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """End the server and everything it started: SIGTERM to its process group, SIGKILL
        after a grace period (a stopped one is continued to act on it); a no-op when it is not
        running."""
        process, self._process = self._process, None
        if process is not None:
            _signal_group(process.pid, signal.SIGTERM)
            _signal_group(process.pid, signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_GRACE_S)
            _signal_group(process.pid, signal.SIGKILL)  # the engine core may outlive the server
            process.wait()
        if self._lifeline is not None:
            self._lifeline.release()
            self._lifeline = None

    def cause(self) -> str:
        """Why the server failed, read off its log: a known cause, or its last error line."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                tail = log.read().decode(errors="replace")
        except OSError:
            tail = ""
        tail = tail.rsplit("\n=== start ", 1)[-1]  # this start's lines only
        return f"{failure_cause(tail, self.port)} (log: {self.log_path})"


def failure_cause(log_text: str, port: int) -> str:
    """A one-line cause of a failed start from the server's log text."""
    for pattern, cause in CAUSES:
        if pattern.search(log_text):
            return cause.format(port=port)
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|exception", line, re.I)]
    last = (errors or lines or ["no output"])[-1]
    return last if len(last) <= 300 else last[:297] + "..."


def healthy(url: str, timeout_s: float = 5.0) -> bool:
    """True when the server at `url` (an OpenAI base URL, /v1) answers `GET /health` with 200."""
    try:
        return httpx.get(url.removesuffix("/v1") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def start_together(processes: Sequence[ServerProcess], timeout_s: float) -> None:
    """Start the servers together (each takes tens of seconds); the first failure raises."""
    if processes:
        with ThreadPoolExecutor(len(processes)) as pool:
            for future in [pool.submit(p.start, timeout_s) for p in processes]:
                future.result()


def stop_for_good(processes: Sequence[ServerProcess], threads: Sequence[threading.Thread]) -> None:
    """Stop `processes` until none of `threads` (which may start one again: a restart that
    began before the stop) is left; a start under way is stopped while starting."""
    while any(thread.is_alive() for thread in threads):
        for process in processes:
            process.stop()
        for thread in threads:
            thread.join(timeout=POLL_S)
    for process in processes:
        process.stop()


def free_port() -> int:
    """A TCP port free on the loopback address now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stale_gguf_override(model: str) -> dict[str, Any]:
    """Hide a GGUF `quantization_config` left in a converted model's config.json.

    A directory converted from GGUF (e.g. an early `smollm2-135m` cache) holds dequantised
    safetensors but may still declare `quant_method: gguf`, which vLLM refuses. Only when the
    directory has no .gguf file is the key overridden away; anything else is left to vLLM.
    """
    directory = Path(model)
    config_file = directory / "config.json"
    if not config_file.is_file() or any(directory.glob("*.gguf")):
        return {}
    try:
        quantization = json.loads(config_file.read_text()).get("quantization_config")
    except (ValueError, AttributeError):  # not a JSON object: vLLM will say so
        return {}
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "gguf":
        return {}
    log.warning("%s: ignoring a stale GGUF quantization_config (weights are safetensors)", model)
    return {"hf_overrides": {"quantization_config": None}}


def whole_prompts(max_model_len: int) -> dict[str, Any]:
    """Engine settings of vLLM's CPU build: no prompt's prefill split across engine steps.

    A split prefill discards the sample of its partial step and rewinds the request's seeded
    generator (`set_offset`), which a CPU `torch.Generator` does not support: the step fails
    ("CPU Generator does not use offset") and with it every request in the batch, which the
    trainer's seeded rollouts hit as soon as enough of them arrive together. vLLM makes the
    same change on CPU itself for MLA models (vllm/platforms/cpu.py): chunked prefill off, and
    a step budget that holds the longest prompt."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 2048)}
