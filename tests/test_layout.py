"""The project's structural rules: import direction, an acyclic import graph, `loop/` reaching
`tasks/` only through its contract, no torch below `loop/`, README <-> CI.

Run: python -m pytest tests/test_layout.py
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"sandbox": {"torch", "tasks", "loop"}, "tasks": {"torch", "loop"}}


def imported_modules(package: str) -> dict[str, set[str]]:
    """Top-level module names imported by each file of `package` (static)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_layers_or_torch(package: str) -> None:
    if not (ROOT / package).is_dir():
        pytest.fail(f"package {package}/ is missing")
    offenders = {
        file: sorted(names & FORBIDDEN[package])
        for file, names in imported_modules(package).items()
        if names & FORBIDDEN[package]
    }
    assert offenders == {}


def loaded_by_importing(
    package: str, forbidden: tuple[str, ...], skip: tuple[str, ...] = ()
) -> list[str]:
    """The modules under `forbidden` top-level names that importing every module of `package`
    (but `skip` and `__main__`) loads, in a fresh interpreter."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"package = importlib.import_module({package!r})\n"
        "for m in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        f"    if not m.name.endswith('__main__') and m.name not in {skip!r}:\n"
        "        importlib.import_module(m.name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {forbidden!r})[:3])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip())


def test_importing_sandbox_loads_no_torch_tasks_or_loop() -> None:
    boot = ("sandbox.kernel_boot",)  # runs inside a kernel, on IPython's builtins
    assert loaded_by_importing("sandbox", ("torch", "tasks", "loop"), skip=boot) == []


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if "bash scripts/setup.sh" in line]
    assert len(commands) == 2, commands
    test_command = next(c for c in commands if "pytest" in c).split("  #")[0].strip()
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for half in test_command.split("&&"):  # each half runs, in order, outside comments
        assert any(line.startswith(half.strip()) for line in ci), (half, ci)
    halves = [half.strip() for half in test_command.split("&&")]
    first = [next(i for i, line in enumerate(ci) if line.startswith(h)) for h in halves]
    assert first == sorted(first), ci


PACKAGES = ("loop", "sandbox", "tasks")
TASKS_CONTRACT = {"tasks", "tasks.core"}  # what loop/ may import of tasks/


def module_name(path: Path) -> str:
    """`loop/generators/hf/engine.py` -> `loop.generators.hf.engine`; an __init__ -> its package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of loop/, sandbox/ and tasks/ it imports, from every import
    statement: top-level, function-level and under TYPE_CHECKING alike. `from a import b`
    points at the module a.b when there is one, else at a."""
    modules = {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else base)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(import_graph()) == []


def test_loop_imports_tasks_only_through_its_contract() -> None:
    reaches = {
        (module, target)
        for module, targets in import_graph().items()
        if module.split(".")[0] == "loop"
        for target in targets
        if target.split(".")[0] == "tasks" and target not in TASKS_CONTRACT
    }
    assert reaches == set()


def test_only_the_two_clis_import_the_builders() -> None:
    importers = sorted(m for m, targets in import_graph().items() if "loop.build" in targets)
    assert importers == []  # train.py and evaluate.py, which are not in the graph


def test_the_split_names_are_defined_once() -> None:
    """tasks.core.SPLITS; the AppWorld engine side's copy (another interpreter) must agree."""
    from tasks.core import SPLITS

    path = ROOT / "tasks" / "appworld" / "engine_side" / "small_root.py"
    copies = [
        ast.literal_eval(node.value)
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SPLITS" for t in node.targets)
    ]
    assert copies == [SPLITS]
    spelled_out = ", ".join(f'"{name}"' for name in SPLITS)  # the tuple written by hand
    spelled = [
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if spelled_out in p.read_text() and p != path
    ]
    assert spelled == ["tasks/core.py"]


# Inside loop/: each role folder, and the config edge (the top-level modules every folder may
# read), may import only what is listed here (run time, function level and TYPE_CHECKING
# alike). The top-level loop (trainer, warmstart, demos, evaluation, build) may import anything.
CONFIG_EDGE = {"loop.config", "loop.config_types", "loop.checks", "loop.seeds"}
FOLDERS = ("algo", "rollout", "learner", "model", "generators", "run", "inspect", "preflight")
MAY_IMPORT: dict[str, set[str]] = {
    "loop.config": set(),  # the config edge: config, config_types, checks, seeds
    "loop.algo": set(),  # pure math: nothing from loop
    "loop.model": {"loop.run.rundir", "loop.config"},  # checkpoint names, one-line errors
    # algo.mcts: DPO-MCTS's tree bookkeeping, pure Python (no torch), for the search
    "loop.rollout": {
        "loop.config",
        "loop.generators.base",
        "loop.generators.tokenizer",
        "loop.algo.mcts",
    },
    "loop.run": {"loop.rollout", "loop.algo"},
    "loop.learner": {"loop.algo", "loop.model", "loop.rollout", "loop.config"},
    "loop.generators": {"loop.model", "loop.config"},
    # the preflight plans a config: it traces the learner's own step on the model's FSDP2
    # groups and counts the hf engine by the engine's own memory rule (arithmetic); it never
    # imports the engines, the rollout side or the top-level loop
    "loop.preflight": {"loop.config", "loop.model", "loop.learner", "loop.generators.hf.memory"},
    # model.aliases only: a model name -> its directory, for the report's tokenizer
    "loop.inspect": {
        "loop.run",
        "loop.rollout",
        "loop.config",
        "loop.generators",
        "loop.model.aliases",
    },
}


def loop_unit(module: str) -> str:
    """The unit a module of loop/ belongs to: its role folder, `loop.config` for the config
    edge, or the module itself (the top-level loop)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return ".".join(parts[:2])
    return "loop.config" if module in CONFIG_EDGE else module


def crossings(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, target) for every import of loop/ that leaves its unit against MAY_IMPORT."""
    found = set()
    for module, targets in graph.items():
        unit = loop_unit(module)
        if unit not in MAY_IMPORT:
            continue  # the top-level loop
        for target in targets:
            if target.split(".")[0] != "loop" or loop_unit(target) == unit or target == "loop":
                continue
            allowed = MAY_IMPORT[unit]
            if loop_unit(target) not in allowed and target not in allowed:
                found.add((module, target))
    return found


def test_loop_folders_import_only_what_they_may() -> None:
    """The math imports nothing from loop; rollout sees only the config and the Generator
    Protocol; run and inspect never import learner or model (except model names); no folder
    imports the top-level loop."""
    assert crossings(import_graph()) == set()


def test_the_folder_rules_catch_a_broken_rule() -> None:
    """The check itself: a math module importing the learner, a run module importing the
    model, and a folder importing the trainer are each reported."""
    graph = {
        "loop.algo.losses": {"loop.learner.batch"},
        "loop.run.runlog": {"loop.model.policy", "loop.rollout.trajectory"},
        "loop.rollout.agent": {"loop.trainer", "loop.config"},
        "loop.trainer": {"loop.learner.learner"},
    }
    assert crossings(graph) == {
        ("loop.algo.losses", "loop.learner.batch"),
        ("loop.run.runlog", "loop.model.policy"),
        ("loop.rollout.agent", "loop.trainer"),
    }


def test_loop_has_the_role_folders_and_few_top_level_modules() -> None:
    folders = sorted(p.name for p in (ROOT / "loop").iterdir() if (p / "__init__.py").is_file())
    assert folders == sorted(FOLDERS)
    top = sorted(p.stem for p in (ROOT / "loop").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 10, top  # the loop and its edges; anything else belongs in a folder


@pytest.mark.parametrize("package", ["loop.rollout", "loop.run", "loop.inspect"])
def test_importing_a_torch_free_folder_loads_no_torch(package: str) -> None:
    """Every module of the folder imported in a fresh interpreter: no torch."""
    assert loaded_by_importing(package, ("torch",)) == []


def test_the_two_engines_never_import_each_other() -> None:
    """generators/hf/ (the training model samples) and generators/vllm/ (servers) share only
    the Protocol and the top-level helpers of generators/."""
    engines = ("loop.generators.hf", "loop.generators.vllm")
    crossing = {
        (module, target)
        for module, targets in import_graph().items()
        for own, other in (engines, engines[::-1])
        if module.startswith(own)
        for target in targets
        if target.startswith(other)
    }
    assert crossing == set()


# Size budgets (STYLE.md 14): each may only go down. A file over its budget is split by
# responsibility, not compressed; the count of `# fmt: skip` lines (hand-aligned code that the
# formatter leaves alone) in product code is a ratchet.
MAX_FILE_LINES = 500
MAX_TRAIN_LINES = 80  # loop/trainer.py's `_train`: the numbered steps, nothing else
MAX_FMT_SKIP = 105


def product_files() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))] + [
        ROOT / "train.py",
        ROOT / "evaluate.py",
    ]


def test_no_product_file_passes_its_line_budget() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in product_files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def test_the_training_loop_stays_its_numbered_steps() -> None:
    tree = ast.parse((ROOT / "loop" / "trainer.py").read_text())
    train = next(
        node for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and node.name == "_train"
    )  # fmt: skip
    assert train.end_lineno is not None
    assert train.end_lineno - train.lineno + 1 <= MAX_TRAIN_LINES


def test_fmt_skip_only_goes_down() -> None:
    count = sum(p.read_text().count("# fmt: skip") for p in product_files())
    assert count <= MAX_FMT_SKIP
