"""The environment an inference engine's processes start in: the launcher's variables removed.

Under `torchrun` (or `accelerate launch`) every learner process carries the launcher's
variables: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`/`MASTER_PORT`, `TORCHELASTIC_USE_AGENT_STORE`
and more. A vLLM server started by rank 0 spawns its own processes, which inherit them; they
then rendezvous with each other over `tcp://`, and with `TORCHELASTIC_USE_AGENT_STORE=True`
torch makes that rendezvous a client of the launcher's store, which serves nobody at that
address: start-up hangs until the store's timeout (reproduced on CPU with gloo in
tests/loop/test_launch_env.py; PyTorch PR #192113, vllm#7939; apple/ml-loop strips these
variables before it starts its servers). `PYTORCH_CUDA_ALLOC_CONF` tuned for the learners is
dropped too, and `CUDA_VISIBLE_DEVICES` is set to the engine's own GPUs when given, so its
tensor-parallel workers do not land on the learners' devices. Those are indices among the GPUs
this process sees, as the learners' `LOCAL_RANK`s are: under an inherited
`CUDA_VISIBLE_DEVICES=2,3,6,7`, devices [2, 3] are the physical GPUs 6 and 7.

    env = launcher_free(os.environ, devices=[4, 5, 6, 7])
    subprocess.Popen(server_command, env=env)     # the server and its processes start clean
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# What torchrun, torch elastic and accelerate set for the processes they launch.
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_", "MASTER_", "GROUP_", "ROLE_", "ACCELERATE_")
LAUNCHER_NAMES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
})  # fmt: skip


def is_launcher_variable(name: str) -> bool:
    """True for a variable a launcher sets for its processes (or tuned for the learners)."""
    return name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES)


def launcher_free(env: Mapping[str, str], devices: Sequence[int] | None = None) -> dict[str, str]:
    """`env` without the launcher's variables; `CUDA_VISIBLE_DEVICES` set to `devices` if any
    (indices among `env`'s own `CUDA_VISIBLE_DEVICES`, when it has one)."""
    clean = {name: value for name, value in env.items() if not is_launcher_variable(name)}
    if devices:
        clean["CUDA_VISIBLE_DEVICES"] = ",".join(visible_devices(env, devices))
    elif "CUDA_VISIBLE_DEVICES" in env:  # no list of its own: the devices this process sees
        clean["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    return clean


def visible_devices(env: Mapping[str, str], devices: Sequence[int]) -> list[str]:
    """The GPUs `devices` name, as a child's `CUDA_VISIBLE_DEVICES` entries: mapped through
    `env`'s `CUDA_VISIBLE_DEVICES` (indices, UUIDs or MIG names), which a child would
    otherwise read as physical indices."""
    inherited = env.get("CUDA_VISIBLE_DEVICES")
    if inherited is None:
        return [str(d) for d in devices]
    seen = [entry.strip() for entry in inherited.split(",") if entry.strip()]
    if missing := [d for d in devices if not 0 <= d < len(seen)]:
        raise ValueError(
            f"generator.devices {list(devices)}: GPU {missing[0]} is not among the "
            f"{len(seen)} this process sees (CUDA_VISIBLE_DEVICES={inherited})"
        )
    return [seen[d] for d in devices]
