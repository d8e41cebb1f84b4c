"""Config loading: YAML + overrides -> RunConfig, and one-line errors naming the key.

Run: python -m pytest tests/loop/test_config.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loop.config import MOVED, ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_quickstart_config_loads() -> None:
    config = load_config(ROOT / "configs" / "quickstart.yaml")
    assert config.model.name == "smollm2-135m" and config.generator.backend == "hf"
    assert config.run_dir == Path("runs") / "quickstart"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    config = load_config(path)
    assert config.name and config.train.iterations >= 0


def test_defaults_follow_the_paper() -> None:
    config = RunConfig()
    assert (config.agent.max_turns, config.agent.max_new_tokens) == (50, 1500)
    assert config.agent.max_context_tokens == 32_768 and config.agent.temperature == 1.0
    assert (config.model.lora_rank, config.model.lora_alpha) == (16, 32)


def test_overrides_are_typed_and_nested(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "agent:\n  max_turns: 3\n"),
        ["agent.max_turns=7", "eval.limit=5", "agent.top_p=0.5", "name=x"],
    )
    assert config.agent.max_turns == 7 and config.eval.limit == 5
    assert config.agent.top_p == 0.5 and config.name == "x"


SERVERS = "generator.backend=vllm_server"


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("agent:\n  max_turn: 3\n", [], "unknown config key agent.max_turn"),
        ("agent:\n  max_turns: ten\n", [], "agent.max_turns: expected int, got 'ten'"),
        ("agent:\n  max_turns: true\n", [], "agent.max_turns: expected int"),
        ("generator:\n  backend: tgi\n", [], "expected one of hf, vllm_server, openai"),
        ("agent: 3\n", [], "agent: expected a mapping"),
        ("- a\n- b\n", [], "top level must be a mapping"),
        ("agent: [unclosed\n", [], "not valid YAML"),
        ("", ["agent.max_turns=0"], "agent.max_turns: must be > 0"),
        ("", ["noequals"], "is not key=value"),
        ("", ["generator.backend=openai"], "needs generator.base_url"),
        ("", ["train.loss=cross_entropy"], "set train.advantage=filter"),
        ("", ["warm_start.source=rollouts"], "needs warm_start.rollouts"),
        ("", ["warm_start.source=gold", "model.lora_rank=0"], "warm_start needs a LoRA"),
        ("", ["warm_start.rft_temperatures=[]", "warm_start.source=rft"], "rft_temperatures"),
        ("", ["warm_start.epochs=0"], "warm_start.epochs: must be > 0"),
        ("", ["train.off_policy.correction=clip"], "expected one of none, truncate, mask"),
        ("", ["train.off_policy.cap=0.5"], "train.off_policy.cap: must be >= 1, got 0.5"),
        (
            "",
            ["train.off_policy.band=[1.5,2]"],
            "train.off_policy.band: [low, high] with 0 <= low <= 1 <= high",
        ),
        ("", ["train.off_policy.band=[0.5]"], "train.off_policy.band: [low, high]"),
        ("", ["generator.kv_rows_mb=0"], "generator.kv_rows_mb: must be > 0, got 0.0"),
        ("", ["model.recompute=all"], "expected one of none, mlp, layers"),
        ("", ["model.recompute_mlp=true"], "model.recompute_mlp is now model.recompute (none"),
        ("", ["eval.sampled_rollouts_per_task=-1"], "eval.sampled_rollouts_per_task: must be >= 0"),
        (
            "",
            ["eval.sampled_rollouts_per_task=2", "eval.sampled_temperature=0"],
            "eval.sampled_temperature: must be > 0 for a sampled pass, got 0.0",
        ),
        (
            "",
            ["train.off_policy.correction=mask", "train.ratio_level=trajectory"],
            "needs train.loss ppo and ratio_level token, got ppo, trajectory",
        ),
        ("", [SERVERS, "generator.servers=[localhost:8000]"], "is not an http(s)://host:port/v1"),
        ("", [SERVERS, "generator.num_servers=0"], "generator.num_servers must be >= 1"),
        (
            "",
            [SERVERS, "generator.servers=[http://a:8000/v1]", "generator.devices=[4]"],
            "attached generator.servers run where they were started",
        ),
    ],
)
def test_bad_configs_are_one_line_errors(
    tmp_path: Path, text: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_splits_are_checked_against_the_suite() -> None:
    from loop.checks import check_splits
    from tasks.apptown.suite import AppTownSuite

    suite = AppTownSuite()
    check_splits(RunConfig(), suite)
    config = RunConfig()
    config.eval.more_splits = ["easy_heldout", "validation"]
    with pytest.raises(ConfigError, match=r"eval.more_splits\[1\]: .*validation"):
        check_splits(config, suite)
    config = RunConfig()
    config.train.split = "no_such_split"  # a training split another suite has
    check_splits(config, suite, training=False)  # evaluating needs only the eval splits
    with pytest.raises(ConfigError, match=r"^train.split: .*no_such_split"):
        check_splits(config, suite)


def test_splits_joined_by_plus_give_both_splits_tasks_and_each_is_checked() -> None:
    from loop.checks import check_splits
    from loop.rollout.task_sampler import split_tasks
    from tasks.apptown.suite import AppTownSuite

    suite = AppTownSuite()
    both = split_tasks(suite, "easy+lookup_warm", None, "warm_start.split")
    assert both == suite.tasks("easy") + suite.tasks("lookup_warm")
    assert {t.split for t in both} == {"easy", "lookup_warm"}
    config = RunConfig()
    config.warm_start.source, config.warm_start.split = "gold", "easy+lookup_warm"
    check_splits(config, suite)
    config.warm_start.split = "easy+nope"
    with pytest.raises(ConfigError, match=r"^warm_start.split: .*'nope'"):
        check_splits(config, suite)


def test_a_config_can_start_from_a_base(tmp_path: Path) -> None:
    (tmp_path / "family").mkdir()
    (tmp_path / "paper.yaml").write_text(
        "name: paper\nagent:\n  max_turns: 40\n  temperature: 0.5\ntrain:\n  lr: 5.0e-5\n"
    )
    child = tmp_path / "family" / "ei.yaml"
    child.write_text("base: ../paper.yaml\nname: ei\nagent:\n  max_turns: 7\n")
    config = load_config(child, ["train.epochs=1"])
    assert (config.name, config.agent.max_turns, config.agent.temperature) == ("ei", 7, 0.5)
    assert (config.train.lr, config.train.epochs) == (5.0e-5, 1)


def test_a_section_inside_a_section_from_yaml_and_overrides(tmp_path: Path) -> None:
    text = "train:\n  epochs: 1\n  kl:\n    coef: 0.04\n  off_policy:\n    band: [0.25, 4]\n"
    train = load_config(write(tmp_path, text), ["train.kl.reference=start"]).train
    assert (train.epochs, train.kl.coef, train.kl.into) == (1, 0.04, "loss")
    assert train.kl.reference == "start"
    assert train.off_policy.band == [0.25, 4.0] and train.off_policy.correction == "none"
    assert load_config(None, ["train.overlap.max_staleness=2"]).train.overlap.max_staleness == 2
    with pytest.raises(ConfigError, match=r"^unknown config key train\.kl\.beta \(known: coef"):
        load_config(None, ["train.kl.beta=0.1"])
    with pytest.raises(ConfigError, match=r"^train\.kl: expected a mapping, got 0\.1$"):
        load_config(None, ["train.kl=0.1"])


@pytest.mark.parametrize(("old", "new"), sorted(MOVED["train"].items()))
def test_a_moved_key_names_its_new_place(tmp_path: Path, old: str, new: str) -> None:
    message = f"^train\\.{old} is now train\\.{new.replace('.', '[.]')}$"
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"train.{old}=1"])
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, f"train:\n  epochs: 1\n  {old}: 1\n"))
    section, field = new.split(".")
    assert hasattr(getattr(RunConfig().train, section), field)


def test_the_removed_in_process_vllm_backend_names_its_replacement(tmp_path: Path) -> None:
    message = (
        "generator.backend vllm (the in-process engine) was removed: use vllm_server (a server "
        "on the same GPU) or hf"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_config(None, ["generator.backend=vllm"])
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        load_config(write(tmp_path, "generator:\n  backend: vllm\n"))


@pytest.mark.parametrize("path", [None, *sorted((ROOT / "configs").rglob("*.yaml"))])
def test_the_resolved_config_a_run_writes_loads_back_the_same(
    tmp_path: Path, path: Path | None
) -> None:
    from loop.run.rundir import write_config

    config = load_config(path, ["train.kl.coef=0.01", "train.horizon.start=3"])
    write_config(tmp_path, config.to_dict())
    assert load_config(tmp_path / "config.yaml") == config


@pytest.mark.parametrize(
    ("text", "message"),
    [("base: missing.yaml\n", "config file not found"), ("base: self.yaml\n", "form a cycle")],
)
def test_bad_bases_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "self.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "self.yaml")


def test_evaluation_runs_with_its_own_turn_limit_where_set() -> None:
    from loop.evaluation import eval_agent_settings

    config = load_config(None, ["agent.max_turns=40", "eval.max_turns=50"])
    assert eval_agent_settings(config).max_turns == 50 and config.agent.max_turns == 40
    assert eval_agent_settings(load_config(None, ["agent.max_turns=40"])).max_turns == 40


def test_a_sampled_pass_runs_beside_the_greedy_one_with_its_own_settings() -> None:
    from loop.evaluation import eval_agent_settings, evaluation_passes

    greedy = load_config(None, ["eval.temperature=0", "eval.rollouts_per_task=1"])
    assert [label for label, _ in evaluation_passes(greedy, "easy")] == ["easy"]
    both = load_config(None, ["eval.temperature=0", "eval.sampled_rollouts_per_task=2"])
    (first, config), (label, sampled) = evaluation_passes(both, "easy")
    assert (first, config) == ("easy", both) and label == "easy@T1"
    assert eval_agent_settings(sampled).temperature == 1.0
    assert sampled.eval.rollouts_per_task == 2 and eval_agent_settings(both).temperature == 0


def test_the_8_gpu_config_clips_like_the_reference_with_4_learners() -> None:
    config = load_config(ROOT / "configs" / "qwen2.5-32b-8gpu.yaml", [])
    assert config.train.max_grad_norm == pytest.approx(0.1 * 4**0.5)
    assert config.eval.max_turns == 50


def test_every_config_field_has_a_one_line_doc_that_help_config_prints() -> None:
    import dataclasses
    import typing

    from loop.config import describe

    def keys(cls: type, prefix: str = "") -> list[str]:
        found = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            text = f.metadata.get("doc", "")
            assert text.strip() and "\n" not in text, f"{prefix}{f.name} has no one-line doc"
            if dataclasses.is_dataclass(hints[f.name]):
                found += keys(hints[f.name], f"{prefix}{f.name}.")
            else:
                found.append(prefix + f.name)
        return found

    printed = describe()
    every = keys(RunConfig)
    assert len(every) > 100
    for key in every:
        assert f"  {key} (" in printed, key


@pytest.mark.parametrize("cli", ["train.py", "evaluate.py"])
def test_the_clis_print_the_config_docs(cli: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / cli), "--help-config"], capture_output=True, text=True,
        cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "train.clip_eps (float, default: 0.1)\n      PPO epsilon" in done.stdout


@pytest.mark.parametrize(
    ("overrides", "world", "message"),
    [
        (["generator.devices=[4,5]", "generator.tensor_parallel_size=4"], 4, "give 4 GPU"),
        (["generator.devices=[3,3]", "generator.tensor_parallel_size=2"], 2, "give distinct"),
        (
            [
                "generator.num_servers=2",
                "generator.devices=[4,5,6]",
                "generator.tensor_parallel_size=2",
            ],
            4,
            "give 4 GPU indices, generator.tensor_parallel_size (2) for each of 2",
        ),
        (
            ["model.device=cpu", "generator.num_servers=2", "generator.devices=[1]"],
            2,
            "at least one CPU core for each of the 2 servers",
        ),
        (["generator.devices=[3,4,5,6]", "generator.tensor_parallel_size=4"], 4, "(GPU 3)"),
        (["train.collective_timeout_s=0"], 1, "must be > 0"),
        (["model.load_in_4bit=true", "model.device=cuda"], 2, "load_in_4bit: one learner"),
    ],
)
def test_engine_devices_and_timeouts_are_checked(
    overrides: list[str], world: int, message: str
) -> None:
    from loop.checks import check_run

    # the servers on GPUs unless a case says otherwise
    config = load_config(None, ["generator.backend=vllm_server", "model.device=cuda", *overrides])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_run(config, world)


def test_the_engine_on_its_own_gpus_passes() -> None:
    from loop.checks import check_run

    config = load_config(
        None,
        [
            "generator.backend=vllm_server",
            "model.device=cuda",
            "generator.devices=[4,5,6,7]",
            "generator.tensor_parallel_size=4",
        ],
    )
    check_run(config, 4)


def test_learners_on_other_nodes_leave_this_nodes_gpus_to_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2 nodes x 4 learners (WORLD_SIZE 8, LOCAL_WORLD_SIZE 4) and a server on rank 0's node:
    only GPUs 0..3 there are the learners'."""
    from loop.checks import check_run

    engine = ["generator.backend=vllm_server", "model.device=cuda", "generator.devices=[4,5]"]
    engine += ["generator.tensor_parallel_size=2"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    check_run(load_config(None, engine), 8)
    check_run(load_config(None, engine), 8, local_world_size=4)
    with pytest.raises(ConfigError, match=r"this node's 4 learners \(GPU 3\)"):
        check_run(load_config(None, [*engine, "generator.devices=[3,4]"]), 8)


# Each backend's refusals, asked of the capability table (loop.checks.BACKENDS): the whole
# one-line message, naming the backends that would do.
ENDPOINT = ["generator.base_url=http://127.0.0.1:1/v1", "generator.served_model=m"]


@pytest.mark.parametrize(
    ("backend", "overrides", "world", "message"),
    [
        ("openai", ENDPOINT, 1, "generator.backend openai cannot train (no weights): use hf or "
         "vllm_server"),
        ("hf", [], 2, "several learner processes need generator.backend vllm_server, not hf"),
        ("hf", ["train.overlap.max_staleness=1"], 1, "train.overlap.max_staleness 1 collects "
         "while the learner trains, which generator.backend hf cannot (it keeps one version of "
         "the weights): use "
         "generator.backend: vllm_server"),
        ("hf", ["train.off_policy.split_mismatch=true"], 1, "needs generator.backend vllm_server "
         "(published adapters), model.lora_rank > 0 and one learner process, got hf"),
        ("vllm_server", ["train.off_policy.old_logprobs=sampler"], 1, "needs generator.backend "
         "hf and model.dtype float32 (the learner's own weights and numbers), got vllm_server, "
         "float32"),
    ],
)  # fmt: skip
def test_each_backend_is_refused_what_it_cannot_do(
    backend: str, overrides: list[str], world: int, message: str
) -> None:
    from loop.checks import check_run

    config = load_config(None, [f"generator.backend={backend}", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        check_run(config, world)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("backend", "overrides", "world"),
    [
        ("vllm_server", [], 2),
        ("vllm_server", ["train.overlap.max_staleness=2"], 1),
        ("hf", ["train.off_policy.old_logprobs=sampler"], 1),
    ],
)
def test_each_backend_runs_what_it_can_do(backend: str, overrides: list[str], world: int) -> None:
    from loop.checks import check_run

    check_run(load_config(None, [f"generator.backend={backend}", *overrides]), world)


def test_the_capability_table_covers_every_backend_a_config_names() -> None:
    import typing

    from loop.build import BUILDERS
    from loop.checks import BACKENDS, having
    from loop.config import GeneratorConfig

    named = typing.get_args(typing.get_type_hints(GeneratorConfig)["backend"])
    assert list(BACKENDS) == list(named) == list(BUILDERS)
    assert all(name == b.name for name, b in BACKENDS.items())
    assert having(lambda b: b.trains) == "hf or vllm_server"
    assert having(lambda b: b.keeps_versions) == "vllm_server"
    # what only an endpoint needs is asked when the config loads
    with pytest.raises(ConfigError, match=r"^generator.backend openai needs generator.base_url"):
        load_config(None, ["generator.backend=openai"])


def test_a_checkpoint_needs_a_backend_with_weights() -> None:
    from loop.build import build_generator

    config = load_config(None, ["generator.backend=openai", *ENDPOINT])
    message = "--checkpoint cannot be used with generator.backend openai (no weights of ours): "
    with pytest.raises(ConfigError, match=re.escape(message + "use hf or vllm_server")):
        build_generator(config, Path("adapter"))


def test_a_suite_is_built_with_the_section_named_after_it_and_no_other() -> None:
    import dataclasses
    import typing

    from loop.build import suite_options
    from loop.config_types import SuiteOptions
    from tasks import SUITES

    url = "openenv.url=http://127.0.0.1:8000"
    options = suite_options(load_config(None, ["suite=openenv", url]))
    assert options["url"] == "http://127.0.0.1:8000" and options["code_field"] == "code"
    assert suite_options(load_config(None, ["suite=apptown", url])) == {}
    hints = typing.get_type_hints(RunConfig)
    sections = [
        f.name
        for f in dataclasses.fields(RunConfig)
        if isinstance(hints[f.name], type) and issubclass(hints[f.name], SuiteOptions)
    ]
    assert sections == ["openenv"] and set(sections) <= set(SUITES)


def test_a_server_start_bound_stays_below_the_collective_timeout() -> None:
    """Rank 0 starts the servers while the other learners wait in a collective: a start bound
    at or past `train.collective_timeout_s` would let that collective time out first."""
    from loop.checks import check_run

    config = load_config(ROOT / "configs" / "qwen2.5-32b-8gpu.yaml", [])
    assert 900 <= config.generator.server_start_timeout_s < config.train.collective_timeout_s
    check_run(config, 4)  # a cold 32B start fits, below the collective timeout
    late = ["generator.server_start_timeout_s=3600"]
    with pytest.raises(ConfigError, match=re.escape(
        "generator.server_start_timeout_s 3600 must be below train.collective_timeout_s 3600"
    )) as caught:  # fmt: skip
        check_run(load_config(ROOT / "configs" / "qwen2.5-32b-8gpu.yaml", late), 4)
    assert "\n" not in str(caught.value)
    check_run(load_config(ROOT / "configs" / "qwen2.5-32b-8gpu.yaml", late), 1)  # none wait
    attached = [*late, "generator.servers=[http://node2:8000/v1]", "generator.devices=[]"]
    check_run(load_config(ROOT / "configs" / "qwen2.5-32b-8gpu.yaml", attached), 4)  # none start


@pytest.mark.parametrize("key", ["request", "publish", "health"])
def test_a_server_timeout_must_be_positive(key: str) -> None:
    """`generator.{request,publish,health}_timeout_s` bound a completion, an adapter load and a
    health probe (loop/generators/vllm/server.py); 0 would fail every one of them."""
    config = ROOT / "configs" / "quickstart-servers.yaml"
    assert load_config(config, []).generator.health_timeout_s > 0
    with pytest.raises(ConfigError, match=f"generator.{key}_timeout_s must be > 0"):
        load_config(config, [f"generator.{key}_timeout_s=0"])
