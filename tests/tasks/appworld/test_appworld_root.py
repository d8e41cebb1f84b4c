"""The AppWorld suite's data root: splits, task metadata, the paper's subset, and loud errors.

No engine is started here (listing tasks is free); the small root is built once per session
(10-30 s, hence `slow`).
Run: python -m pytest tests/tasks/appworld/test_appworld_root.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import get_suite
from tasks.appworld import PAPER_TRAIN_SPLIT, AppWorldSetupError, AppWorldSuite

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def test_splits_come_from_the_dataset_files(small_root: Path) -> None:
    suite = AppWorldSuite(small_root)
    for split, tasks in suite.splits.items():
        listed = (small_root / "data" / "datasets" / f"{split}.txt").read_text().split()
        assert [t.id for t in tasks] == listed
        assert all(t.split == split for t in tasks)
    task = suite.task("c0a1b2e_1")
    assert (task.scenario_id, task.variant, task.difficulty) == ("c0a1b2e", 1, 3)
    assert task.apps == ("phone", "simple_note")
    assert task.instruction.startswith("Create a note in Simple Note")
    assert suite.specs(task)["supervisor"]["first_name"] == "Dana"


def test_the_paper_subset_is_train_tasks_of_difficulty_1_and_2(small_root: Path) -> None:
    suite = AppWorldSuite(small_root)
    subset = suite.tasks(PAPER_TRAIN_SPLIT)
    assert [t.id for t in subset] == [t.id for t in suite.tasks("train") if t.difficulty <= 2]
    assert "c0a1b2e_1" not in {t.id for t in subset}  # difficulty 3, per its metadata.json
    assert len(subset) == 5


def test_the_dev_denylist_is_an_option(small_root: Path) -> None:
    kept = AppWorldSuite(small_root, exclude_dev_denylist=False, denylist=("c0a1b2f_1",))
    dropped = AppWorldSuite(small_root, exclude_dev_denylist=True, denylist=("c0a1b2f_1",))
    assert [t.id for t in kept.tasks("dev")] == ["c0a1b2f_1"]
    assert dropped.tasks("dev") == []
    with pytest.raises(KeyError, match="c0a1b2f_1"):
        dropped.task("c0a1b2f_1")


def test_the_registry_builds_it_and_unknown_splits_are_named(small_root: Path) -> None:
    suite = get_suite("appworld", root=small_root)
    assert isinstance(suite, AppWorldSuite) and suite.name == "appworld"
    with pytest.raises(KeyError, match="train_paper"):
        suite.tasks("validation")


def test_a_missing_root_names_the_variable_and_the_fix(
    engine_python: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("APPWORLD_ROOT", raising=False)
    with pytest.raises(AppWorldSetupError, match=r"set APPWORLD_ROOT.*appworld download data"):
        AppWorldSuite()
    with pytest.raises(AppWorldSetupError, match="does not exist"):
        AppWorldSuite(tmp_path / "nowhere")
    with pytest.raises(AppWorldSetupError, match="has no data/ directory"):
        AppWorldSuite(tmp_path)


def test_the_root_may_be_given_by_its_data_directory(small_root: Path) -> None:
    assert AppWorldSuite(small_root / "data").root == small_root


def test_a_missing_venv_names_the_setup_command(small_root: Path, tmp_path: Path) -> None:
    with pytest.raises(AppWorldSetupError, match=r"bash scripts/setup_appworld\.sh"):
        AppWorldSuite(small_root, venv=tmp_path / "no-venv")


def test_an_incomplete_root_is_refused_before_the_engine_could_fake_it(
    small_root: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(small_root, broken, symlinks=True)
    (broken / "data" / "tasks" / "c0a1b2d_1" / "dbs" / "phone.jsonl").unlink()
    with pytest.raises(AppWorldSetupError) as error:
        AppWorldSuite(broken)
    message = str(error.value)
    assert "tasks/c0a1b2d_1/dbs/phone.jsonl is missing" in message
    assert "empty databases" in message and "\n" not in message
    (broken / "data" / "datasets" / "dev.txt").unlink()
    with pytest.raises(AppWorldSetupError, match=r"dev\.txt is missing"):
        AppWorldSuite(broken)


def test_tasks_never_imports_appworld_or_its_pydantic() -> None:
    code = (
        "import sys, tasks.appworld, tasks.appworld.suite, tasks.appworld.env\n"
        "print([m for m in sys.modules if m.split('.')[0] in ('appworld', 'torch', 'loop')])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
