"""Build a small AppWorld data root from scratch (runs inside the AppWorld virtualenv).

    <venv>/bin/python -I tasks/appworld/engine_side/small_root.py OUT_DIR

Writes OUT_DIR/data/ (base_dbs, api_docs, tasks, datasets) and OUT_DIR/small_root.json (each
task's gold and wrong solutions and its answer, for tests and benchmarks). Everything is made by the
installed package's own models (`Model.save()` keeps record hashes and full-text search right)
and its own API-doc generator, under a frozen clock. Nothing here is copied from the official
data, and the output must not be committed: it is derived from the licensed app code.

The world (small_root_tasks.py): one supervisor with accounts in every app, ten people in the
supervisor's phone contacts, 31 notes in Simple Note. Eight tasks in five scenarios:
- c0a1b2c_1..3  question, phone: "How many of my contacts are my <relationship>s?" (train, d1)
- c0a1b2d_1..2  action, phone: add a contact (train, d1)
- c0a1b2e_1     multi-app: coworkers' numbers from phone into a Simple Note note (train, d3)
- c0a1b2f_1     pagination: count the notes with a tag; 23 of them, 20 per page (dev, d2)
- c0a1b31_1     question: my manager's phone number (test_normal, d1)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from textwrap import dedent, indent
from typing import Any

# Run as a script with -I, so its own directory is not on sys.path: add it for the task data.
# (Never name a module here `evaluation`: AppWorld imports each task's evaluation.py by that
# bare name, and a module found first on sys.path would grade every task.)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from small_root_tasks import CONTACTS, NOTE_TAGS, PASSWORD, SUPERVISOR, TASKS, email_of

# tasks.core.SPLITS, copied: this script runs in AppWorld's interpreter, which cannot import
# tasks/ (tests/test_layout.py checks that the two agree).
SPLITS = ("train", "dev", "test_normal", "test_challenge")


def main(out: Path) -> None:
    """Build the whole root under `out` (which must not have a data/ directory yet)."""
    data = out / "data"
    if data.exists():
        raise SystemExit(f"small_root: {data} exists already; remove it or pick another dir")
    os.environ["APPWORLD_ROOT"] = str(out)
    import appworld
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def no_fsync(connection: Any, _: Any) -> None:
        # The models commit once per row (full-text search), each an fsync: 20 ms apiece
        # here. A crash mid-build leaves a broken root either way, so skip them.
        connection.execute("PRAGMA synchronous=OFF")

    appworld.update_root(str(out))
    from appworld.apps import get_all_apps
    from appworld.apps.api_lib import set_local_date_and_time
    from appworld.common.constants import DEFAULT_SYSTEM_DATETIME

    freezer = set_local_date_and_time(DEFAULT_SYSTEM_DATETIME)
    base = data / "base_dbs"
    base.mkdir(parents=True)
    build_base_dbs(base, get_all_apps())
    write_api_docs(data, get_all_apps(skip_admin=True))
    for spec in TASKS:
        write_task(data, base, spec, DEFAULT_SYSTEM_DATETIME, get_all_apps())
    (data / "datasets").mkdir()
    for split in SPLITS:
        ids = [spec["id"] for spec in TASKS if spec["split"] == split]
        (data / "datasets" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
    solutions = {
        spec["id"]: {"gold": spec["gold"], "wrong": spec["wrong"], "answer": spec["answer"]}
        for spec in TASKS
    }
    (out / "small_root.json").write_text(json.dumps(solutions, indent=1) + "\n")
    freezer.stop()


def build_base_dbs(base: Path, apps: list[str]) -> None:
    """The schema of every app, then the world's rows, written through the package's models."""
    from appworld.apps.api_lib import CompanyNotifier
    from appworld.common.utils import import_models_module

    models = {app: import_models_module(app) for app in apps}
    for app in apps:
        models[app].SQLModel.set_db(to_db_home_path=str(base), create=True)
    admin, sup = models["admin"], models["supervisor"]
    person = {**SUPERVISOR, "birthday": "1990-04-12", "sex": "female"}
    main_user = admin.MainUser.create_save(**person)
    supervisor = sup.Supervisor.create_save(**person)
    user_apps = [a for a in apps if a not in ("admin", "api_docs", "supervisor")]
    for app in user_apps:
        admin.AccountPassword.create_save(
            main_user_id=main_user.id, account_name=app, password=PASSWORD
        )
        sup.AccountPassword.create_save(
            supervisor_id=supervisor.id, account_name=app, password=PASSWORD
        )
        names: dict[str, Any] = {k: SUPERVISOR[k] for k in ("first_name", "last_name")}
        if app == "phone":
            account = {**names, "phone_number": SUPERVISOR["phone_number"]}
        else:
            account = {**names, "email": SUPERVISOR["email"]}
            if "verified" in models[app].User.__fields__:
                account["verified"] = True
        models[app].User.create_save(**account, password=PASSWORD)
    for app in user_apps:  # the accounts that send signup, reset and order notifications
        CompanyNotifier(app).create_accounts(skip_if_exists=True)
    phone_user = models["phone"].User.find_one(phone_number=SUPERVISOR["phone_number"])
    contact = models["phone"].Contact
    contact.save_all(  # one commit per table: a commit per row is an fsync per row
        [
            contact.create(
                user_id=phone_user.id,
                first_name=first,
                last_name=last,
                email=email_of(first, last),
                phone_number=number,
                relationships=rels,
            )
            for first, last, number, rels in CONTACTS
        ]
    )
    note_user = models["simple_note"].User.find_one(email=SUPERVISOR["email"])
    note = models["simple_note"].Note
    note.save_all(
        [
            note.create(
                user_id=note_user.id,
                title=f"{tag.title()} note {i}",
                content=f"Something about {tag}, number {i}.",
                tags=[tag],
            )
            for i, tag in enumerate(NOTE_TAGS, start=1)
        ]
    )


def write_api_docs(data: Path, apps: list[str]) -> None:
    """api_docs/standard/<app>.json and the api_docs app's ApiDoc rows, from the app code."""
    from appworld.api_docs import prepare_api_docs
    from appworld.common.constants import CANARY_STRING
    from appworld.common.utils import import_models_module

    api_docs = import_models_module("api_docs")
    folder = data / "api_docs" / "standard"
    folder.mkdir(parents=True)
    for app in apps:
        docs = prepare_api_docs(app)
        by_name = {doc["api_name"]: {**doc, "canary_string": CANARY_STRING} for doc in docs}
        (folder / f"{app}.json").write_text(json.dumps(by_name, indent=1))
        rows = [
            api_docs.ApiDoc.create(
                app_name_=app,
                api_name=doc["api_name"],
                path=doc["path"],
                method=doc["method"],
                description=doc["description"],
                parameters=doc["parameters"],
                response_schemas=doc["response_schemas"],
            )
            for doc in docs
        ]
        api_docs.ApiDoc.save_all(rows)


def write_task(data: Path, base: Path, spec: dict[str, Any], now: Any, apps: list[str]) -> None:
    """specs.json, the task's change log over base_dbs (its Task row) and minimal ground truth."""
    from appworld.collections.models import ModelCollection
    from appworld.common.constants import DB_VERSION

    task_dir = data / "tasks" / spec["id"]
    (task_dir / "ground_truth").mkdir(parents=True)
    collection = ModelCollection.load(
        to_db_home_path=f":memory:small-root-{spec['id']}",
        from_db_home_path=str(base),
        load_apps=apps,
    )
    supervisor = collection.supervisor.Supervisor.first()
    collection.supervisor.Task.create_save(
        supervisor_id=supervisor.id, instruction=spec["instruction"], answer="null"
    )
    collection.save(db_home_path=str(task_dir / "dbs"), format="changes", save_model_hashes=True)
    collection.close()
    specs = {
        "instruction": spec["instruction"],
        "supervisor": SUPERVISOR,
        "datetime": now.isoformat(),
        "db_version": DB_VERSION,
    }
    write_json(task_dir / "specs.json", specs)
    truth = task_dir / "ground_truth"
    metadata = {
        "difficulty": spec["difficulty"],
        "num_apps": len(spec["apps"]),
        "num_solution_code_lines": sum(len(c.splitlines()) for c in spec["gold"]),
    }
    write_json(truth / "metadata.json", metadata)
    write_json(truth / "required_apps.json", spec["apps"])
    write_json(truth / "public_data.json", spec.get("public", {}))
    write_json(truth / "private_data.json", spec.get("private", {}))
    write_json(truth / "answer.json", spec["answer"])
    (truth / "evaluation.py").write_text(evaluation_source(spec["tests"]))
    write_json(
        truth / "test_data.json",
        [{"requirement": req, "label": label} for req, label, _ in spec["tests"]],
    )


def evaluation_source(tests: list[tuple[str, str, str]]) -> str:
    """An AppWorld evaluation.py: one `with test(requirement):` block per test."""
    lines = [
        "import json",
        "",
        "",
        "def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):",
    ]
    for requirement, _, body in tests:
        lines.append(f'    with test("""\n        {requirement}\n    """):')
        lines.append(indent(dedent(body).strip(), " " * 8))
    return "\n".join(lines) + "\n"


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: small_root.py OUT_DIR")
    main(Path(sys.argv[1]).resolve())
