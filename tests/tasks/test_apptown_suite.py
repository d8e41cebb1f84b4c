"""The AppTown task suite: its shape (scenarios, variants, splits, difficulty), the registry,
import hygiene, and that every gold solution passes and every wrong one fails (in process; the
same check through the real sandbox is in test_apptown_sandbox.py).

Run: python -m pytest tests/tasks/test_apptown_suite.py -q
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tasks import SPLITS, Task, get_suite
from tasks.apptown import AppTownSuite
from tasks.apptown.env import fingerprint
from tasks.apptown.inprocess import run_in_process

ROOT = Path(__file__).resolve().parents[2]


def test_at_least_30_scenarios_of_3_variants(suite: AppTownSuite) -> None:
    tasks = [t for split in SPLITS for t in suite.tasks(split)]  # the AppWorld-style splits
    per_scenario = Counter(t.scenario_id for t in tasks)
    assert len(per_scenario) >= 30
    assert set(per_scenario.values()) == {3}
    for t in tasks:
        assert t.id == f"{t.scenario_id}_{t.variant}" and t.difficulty in (1, 2, 3), t
    instructions = [t.instruction for t in tasks]
    assert len(set(instructions)) == len(instructions), "variants must differ in wording/values"


def check_band_holds_out(
    suite: AppTownSuite, train_split: str, heldout_split: str, scenarios: set[str]
) -> None:
    """A band's splits draw on `scenarios` only, and a held-out variant is another user, never
    a training one (variants 1-3 or the band's training split) renamed or reworded."""
    heldout, band = suite.tasks(heldout_split), suite.tasks(train_split)
    assert {t.scenario_id for t in heldout} == {t.scenario_id for t in band} == scenarios
    trained = suite.tasks("train") + band
    seen = {(suite.user_of(t).id, t.instruction) for t in trained}
    users = Counter((t.scenario_id, suite.user_of(t).id) for t in trained + heldout)
    for task in heldout:
        assert (suite.user_of(task).id, task.instruction) not in seen, task.id
        assert users[(task.scenario_id, suite.user_of(task).id)] == 1, task.id


def test_the_easy_band_holds_out_variants_no_training_split_has(suite: AppTownSuite) -> None:
    easy_scenarios = {t.scenario_id for t in suite.tasks("train") if t.difficulty == 1}
    heldout, easy = suite.tasks("easy_heldout"), suite.tasks("easy")
    assert Counter(t.scenario_id for t in heldout) == dict.fromkeys(easy_scenarios, 6)
    assert Counter(t.scenario_id for t in easy) == dict.fromkeys(easy_scenarios, 12)
    assert all(t.difficulty == 1 for t in heldout + easy)
    check_band_holds_out(suite, "easy", "easy_heldout", easy_scenarios)


def test_the_lookup_band_holds_out_variants_no_training_split_has(suite: AppTownSuite) -> None:
    """Difficulty 2: variants of train scenarios (5 held out, 10 to train on); difficulty 1:
    scenarios of the band alone (8 held out, 10 to train on, none in `train`)."""
    heldout, lookup = suite.tasks("lookup_heldout"), suite.tasks("lookup")
    by_difficulty = {d: {t.scenario_id for t in lookup if t.difficulty == d} for d in (1, 2)}
    assert len(by_difficulty[1]) >= 4 and len(by_difficulty[2]) >= 4
    sizes = {s: (8 if s in by_difficulty[1] else 5) for s in by_difficulty[1] | by_difficulty[2]}
    assert Counter(t.scenario_id for t in heldout) == sizes
    assert Counter(t.scenario_id for t in lookup) == dict.fromkeys(sizes, 10)
    assert {t.difficulty for t in heldout + lookup} == {1, 2}
    trained = {t.scenario_id for t in suite.tasks("train")}
    assert trained >= by_difficulty[2] and not trained & by_difficulty[1]  # no dev or test one
    check_band_holds_out(suite, "lookup", "lookup_heldout", set(sizes))


# An API a gold cell calls, or hands to the paging helper (`all_pages(apis.phone.search_contacts,
# ...)` calls it too).
API_REFERENCE = re.compile(r"apis\.(\w+)\.(\w+)\b")


def gold_apis(suite: AppTownSuite, task: Task) -> set[str]:
    """The app.api names `task`'s gold solution uses, less logins, supervisor and api_docs."""
    return {
        f"{app}.{api}"
        for cell in suite.gold_solution(task)
        for app, api in API_REFERENCE.findall(cell)
        if app not in ("supervisor", "api_docs") and api != "login"
    }


def test_the_lookup_band_needs_apis_the_easy_band_never_shows(suite: AppTownSuite) -> None:
    """The band's point: its gold solutions call APIs that the `easy` split's gold solutions
    (the warm start's demonstrations) never call, so an agent has to look them up. A
    difficulty-2 task needs at least two of them and shares only the contact search with the
    easy band (the only way to find who the user's roommates or relatives are); a difficulty-1
    task needs one."""
    easy = set().union(*(gold_apis(suite, t) for t in suite.tasks("easy")))
    band = suite.tasks("lookup") + suite.tasks("lookup_heldout")
    for task in band:
        used = gold_apis(suite, task)
        if task.difficulty == 2:
            assert used & easy <= {"phone.search_contacts"}, (task.id, used & easy)
        assert len(used - easy) >= task.difficulty, (task.id, used)


def test_the_lookup_warm_demonstrations_vary_each_apps_api_and_show_no_lookup_one(
    suite: AppTownSuite,
) -> None:
    """`lookup_warm` (demonstrations only) uses the easy band's apps with APIs the easy band
    does not call and no lookup task needs, so that with `easy` each of its apps shows two or
    more."""
    apis = {s: [gold_apis(suite, t) for t in suite.tasks(s)] for s in ("easy", "lookup_warm")}
    easy, warm = set().union(*apis["easy"]), set().union(*apis["lookup_warm"])
    band = suite.tasks("lookup") + suite.tasks("lookup_heldout")
    looked_up = set().union(*(gold_apis(suite, t) for t in band))
    assert all(used - easy for used in apis["lookup_warm"])  # each task: an API easy lacks
    assert not warm & (looked_up - easy)  # and none that only the lookup band calls
    assert {a.split(".")[0] for a in warm} <= {a.split(".")[0] for a in easy}
    for app in {a.split(".")[0] for a in warm}:
        assert len({a for a in easy | warm if a.startswith(f"{app}.")}) >= 2, app


def test_extra_variants_leave_the_first_three_unchanged(suite: AppTownSuite) -> None:
    from tasks.apptown.scenarios import SCENARIOS

    banded = [s for s in SCENARIOS if s.more_variants]
    assert banded
    for scenario in banded:
        plain = type(scenario)()
        plain.more_variants = ()  # type: ignore[misc]
        first = plain.variants(suite.world)
        assert first == scenario.variants(suite.world)[:3], scenario.id


def test_splits_and_difficulty_bands(suite: AppTownSuite) -> None:
    assert all(suite.tasks(split) for split in SPLITS)
    scenarios = {s: {t.scenario_id for t in suite.tasks(s)} for s in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            assert a == b or not scenarios[a] & scenarios[b], (a, b)
    easy = [t for t in suite.tasks("train") if t.difficulty == 1]
    assert len(easy) >= 12, "the easy band a small model can learn from"


def test_challenge_scenarios_use_an_app_no_train_scenario_uses(suite: AppTownSuite) -> None:
    train_apps = {app for t in suite.tasks("train") for app in t.apps}
    for t in suite.tasks("test_challenge"):
        assert set(t.apps) - train_apps, f"{t.id} uses only train apps {t.apps}"


def test_registry_selects_apptown() -> None:
    built = get_suite("apptown")
    assert built.name == "apptown" and len(built.tasks("dev")) == 18
    with pytest.raises(KeyError, match="unknown task suite"):
        get_suite("nope")


def test_same_seed_same_tasks(suite: AppTownSuite) -> None:
    again = AppTownSuite(seed=0)
    assert [t.instruction for t in again.tasks("train")] == [
        t.instruction for t in suite.tasks("train")
    ]
    task = suite.tasks("train")[0]
    assert (
        again.initial_state(task).fork().serialize() == suite.initial_state(task).fork().serialize()
    )


def test_every_gold_passes_and_every_wrong_fails_in_process(suite: AppTownSuite) -> None:
    problems = []
    for split in suite.splits:
        for task in suite.tasks(split):
            gold = run_in_process(suite, task, suite.gold_solution(task))
            if not gold.report.success or gold.errors:
                problems.append(f"gold {gold.report.summary()} {gold.errors}")
            wrong = run_in_process(suite, task, suite.wrong_solution(task))
            if wrong.report.success:
                problems.append(f"wrong solution of {task.id} passes")
    assert not problems, "\n".join(problems)


def test_a_no_op_fails_the_task_and_keeps_the_collateral_check(suite: AppTownSuite) -> None:
    for task in suite.tasks("train"):
        report = run_in_process(suite, task, []).report
        assert not report.success, task.id
        assert report.tests[-1].name == "no_collateral_changes" and report.tests[-1].passed


def test_completing_without_acting_passes_only_the_collateral_check(suite: AppTownSuite) -> None:
    """What `reward: acted` relies on: in every task, `complete_task()` alone changes no state
    and passes no test but the collateral one, so passing another test is acting."""
    problems = []
    for split in suite.splits:
        for task in suite.tasks(split):
            report = run_in_process(suite, task, ["apis.supervisor.complete_task()"]).report
            passed = [t.name for t in report.tests if t.passed and not t.collateral]
            if passed or report.state_changed is not False:
                problems.append(f"{task.id}: passed {passed}, changed {report.state_changed}")
    assert not problems, "\n".join(problems)


def test_gold_solutions_use_only_apis() -> None:
    suite = AppTownSuite()
    forbidden = re.compile(r"\b(open|exec|eval|__import__|sqlite3|suite|os\.)\b")
    for split in suite.splits:
        for task in suite.tasks(split):
            for cell in suite.gold_solution(task):
                assert not forbidden.search(cell), (task.id, cell)


def test_tasks_import_neither_torch_nor_loop() -> None:
    code = (
        "import sys, tasks, tasks.apptown, tasks.apptown.env, tasks.apptown.inprocess;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'loop')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    for path in (ROOT / "tasks").rglob("*.py"):
        assert not re.search(r"^\s*(from|import) loop\b", path.read_text(), re.M), path


def test_a_state_no_environment_holds_is_freed_and_built_again_the_same() -> None:
    """The host holds the initial states of the tasks in flight only; one built again equals
    the first byte for byte (every task of the easy splits)."""
    suite = get_suite("apptown", seed=0)
    tasks = suite.tasks("easy") + suite.tasks("easy_heldout")
    first = {task.id: fingerprint(suite.initial_state(task).fork()) for task in tasks}
    held = suite.initial_state(tasks[0])
    gc.collect()
    assert list(suite._states) == [tasks[0].id]  # only the one still held
    assert suite.initial_state(tasks[0]) is held
    again = {task.id: fingerprint(suite.initial_state(task).fork()) for task in tasks}
    assert again == first
