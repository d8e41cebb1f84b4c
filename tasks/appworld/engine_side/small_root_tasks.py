"""The small root's world and tasks, as plain data (no appworld import; see small_root.py).

The world: one supervisor, Dana Whitfield, with an account in every app; ten people in her
phone contacts (coworkers, friends, siblings, a parent, a manager); 31 notes in Simple Note.
Each task: id, split, difficulty, the apps it needs, the instruction, the expected answer, its
tests as (requirement, AppWorld label, body of the `with test(...)` block), and gold and
plausible wrong solutions as REPL cells. Every test body reads the final state only through
AppWorld's evaluation API (`models.changed_records`, `test.answer`, `test.case`).
"""

from __future__ import annotations

from textwrap import dedent
from typing import Any

SUPERVISOR = {
    "first_name": "Dana",
    "last_name": "Whitfield",
    "email": "dana.whitfield@gmail.com",
    "phone_number": "4155550134",
}
PASSWORD = "dana-pass-1"
# (first, last, phone, relationships)
CONTACTS = [
    ("Ravi", "Patel", "4155550101", ["coworker"]),
    ("Lena", "Okafor", "4155550102", ["coworker"]),
    ("Tom", "Becker", "4155550103", ["coworker", "friend"]),
    ("Sofia", "Alvarez", "4155550104", ["friend"]),
    ("Marco", "Rossi", "4155550105", ["friend"]),
    ("Priya", "Nair", "4155550106", ["friend"]),
    ("Grace", "Whitfield", "4155550107", ["sibling"]),
    ("Owen", "Whitfield", "4155550108", ["sibling"]),
    ("Helen", "Whitfield", "4155550109", ["parent"]),
    ("Irene", "Kowalski", "4155550110", ["manager"]),
]
NOTE_TAGS = ["recipe"] * 23 + ["travel"] * 5 + ["work"] * 3  # 31 notes
LOGIN = """\
profile = apis.supervisor.show_profile()
passwords = {a["account_name"]: a["password"] for a in apis.supervisor.show_account_passwords()}
"""
PHONE_LOGIN = (
    LOGIN + 'phone = apis.phone.login(username=profile["phone_number"], '
    'password=passwords["phone"])["access_token"]\n'
)
NOTE_LOGIN = (
    LOGIN + 'note = apis.simple_note.login(username=profile["email"], '
    'password=passwords["simple_note"])["access_token"]\n'
)
CONTACTS_BY_RELATIONSHIP = """\
found, page = [], 0
while True:
    batch = apis.phone.search_contacts(
        access_token=phone, relationship={rel!r}, page_index=page, page_limit=20
    )
    found += batch
    if len(batch) < 20:
        break
    page += 1
"""
NO_CHANGES = (
    "no model of any app was changed",
    "no_op_pass",
    "test.case(models.changed_model_names(), '==', set())",
)


def email_of(first: str, last: str) -> str:
    return f"{first.lower()}.{last.lower()}@gmail.com"


def answer_test(label: str = "no_op_fail") -> tuple[str, str, str]:
    body = """\
    task = models.end.supervisor.Task.first()
    predicted = json.loads(task.answer) if task.answer else None
    test.answer(predicted, ground_truth_answer)
    """
    return ("the answer given to complete_task is correct", label, body)


def count_question(n: int, rel: str) -> dict[str, Any]:
    answer = sum(rel in rels for *_, rels in CONTACTS)
    gold = PHONE_LOGIN + CONTACTS_BY_RELATIONSHIP.format(rel=rel)
    first_page = 'found = apis.phone.search_contacts(access_token=phone, relationship="x")\n'
    return {
        "id": f"c0a1b2c_{n}",
        "split": "train",
        "difficulty": 1,
        "apps": ["phone"],
        "instruction": f"How many of my phone contacts are my {rel}s?",
        "answer": answer,
        "tests": [answer_test(), NO_CHANGES],
        "gold": [gold, "apis.supervisor.complete_task(answer=len(found))"],
        "wrong": [PHONE_LOGIN + first_page, "apis.supervisor.complete_task(answer=len(found) + 1)"],
    }


def add_contact(n: int, first: str, last: str, phone: str, rel: str) -> dict[str, Any]:
    email = email_of(first, last)
    add = (
        f"apis.phone.add_contact(access_token=phone, first_name={first!r}, last_name={last!r}, "
        f"phone_number={phone!r}, email={email!r}, relationships=[{rel!r}])"
    )
    checks = """\
    added, updated, removed = models.changed_records("phone.Contact")
    test.case(len(added), "==", 1)
    test.case(len(updated) + len(removed), "==", 0)
    """
    fields = """\
    added, _, _ = models.changed_records("phone.Contact")
    contact = added[0]
    expected = private_data.contact
    test.case(contact.first_name, "==", expected.first_name)
    test.case(contact.last_name, "==", expected.last_name)
    test.case(contact.phone_number, "==", expected.phone_number)
    test.case(contact.email, "==", expected.email)
    test.case(expected.relationship, "in", contact.relationships)
    """
    others = "test.case(models.changed_model_names(), '<=', {'phone.Contact'})"
    return {
        "id": f"c0a1b2d_{n}",
        "split": "train",
        "difficulty": 1,
        "apps": ["phone"],
        "instruction": (
            f"Add {first} {last} to my phone contacts as my {rel}. "
            f"Their phone number is {phone} and their email is {email}."
        ),
        "answer": None,
        "private": {
            "contact": {
                "first_name": first,
                "last_name": last,
                "phone_number": phone,
                "email": email,
                "relationship": rel,
            }
        },
        "tests": [
            (
                "exactly one phone contact was added and none changed or removed",
                "no_op_fail",
                checks,
            ),
            (
                "the new contact has the requested name, number, email and relationship",
                "no_op_fail",
                fields,
            ),
            ("nothing but phone contacts was changed", "no_op_pass", others),
        ],
        "gold": [PHONE_LOGIN + add, "apis.supervisor.complete_task()"],
        "wrong": [
            PHONE_LOGIN + add.replace(phone, phone[:-1] + "9"),
            "apis.supervisor.complete_task()",
        ],
    }


def coworker_note() -> dict[str, Any]:
    title = "Coworker phone numbers"
    lines = [f"{f} {la}: {p}" for f, la, p, rels in CONTACTS if "coworker" in rels]
    gold = (
        PHONE_LOGIN
        + CONTACTS_BY_RELATIONSHIP.format(rel="coworker")
        + NOTE_LOGIN.replace(LOGIN, "")
        + "lines = [f\"{c['first_name']} {c['last_name']}: {c['phone_number']}\" for c in found]\n"
        + f"apis.simple_note.create_note(access_token=note, title={title!r}, "
        + 'content="\\n".join(lines))\n'
    )
    checks = """\
    added, updated, removed = models.changed_records("simple_note.Note")
    test.case(len(added), "==", 1)
    test.case(len(updated) + len(removed), "==", 0)
    test.case(added[0].title, "==", public_data.title, ignore_case=True, strip=True)
    """
    content = """\
    added, _, _ = models.changed_records("simple_note.Note")
    lines = [line.strip() for line in added[0].content.splitlines() if line.strip()]
    test.case(sorted(lines), "==", sorted(private_data.lines))
    """
    others = "test.case(models.changed_model_names(), '<=', {'simple_note.Note'})"
    return {
        "id": "c0a1b2e_1",
        "split": "train",
        "difficulty": 3,
        "apps": ["phone", "simple_note"],
        "instruction": (
            f"Create a note in Simple Note titled '{title}' listing every coworker in my phone "
            "contacts, one per line, as 'First Last: phone number'."
        ),
        "answer": None,
        "public": {"title": title},
        "private": {"lines": lines},
        "tests": [
            ("exactly one note was added, with the requested title", "no_op_fail", checks),
            ("the note lists exactly my coworkers as 'First Last: number'", "no_op_fail", content),
            ("nothing but notes was changed", "no_op_pass", others),
        ],
        "gold": [gold, "apis.supervisor.complete_task()"],
        "wrong": [
            gold.replace('relationship="coworker"', 'relationship="friend"').replace(
                "'coworker'", "'friend'"
            ),
            "apis.supervisor.complete_task()",
        ],
    }


def tagged_notes() -> dict[str, Any]:
    gold = NOTE_LOGIN + dedent("""\
        notes, page = [], 0
        while True:
            batch = apis.simple_note.search_notes(
                access_token=note, tags=["recipe"], page_index=page, page_limit=20
            )
            notes += batch
            if len(batch) < 20:
                break
            page += 1
        """)
    one_page = NOTE_LOGIN + (
        'notes = apis.simple_note.search_notes(access_token=note, tags=["recipe"], page_limit=20)\n'
    )
    return {
        "id": "c0a1b2f_1",
        "split": "dev",
        "difficulty": 2,
        "apps": ["simple_note"],
        "instruction": "How many of my notes in Simple Note are tagged 'recipe'?",
        "answer": NOTE_TAGS.count("recipe"),
        "tests": [answer_test(), NO_CHANGES],
        "gold": [gold, "apis.supervisor.complete_task(answer=len(notes))"],
        "wrong": [one_page, "apis.supervisor.complete_task(answer=len(notes))"],
    }


def manager_phone() -> dict[str, Any]:
    manager = next(c for c in CONTACTS if "manager" in c[3])
    gold = PHONE_LOGIN + CONTACTS_BY_RELATIONSHIP.format(rel="manager")
    return {
        "id": "c0a1b31_1",
        "split": "test_normal",
        "difficulty": 1,
        "apps": ["phone"],
        "instruction": "What is the phone number of my manager? My phone contacts have it.",
        "answer": manager[2],
        "tests": [answer_test(), NO_CHANGES],
        "gold": [gold, "apis.supervisor.complete_task(answer=found[0]['phone_number'])"],
        "wrong": [gold, "apis.supervisor.complete_task(answer=found[0]['email'])"],
    }


TASKS = [
    count_question(1, "coworker"),
    count_question(2, "friend"),
    count_question(3, "sibling"),
    add_contact(1, "Jordan", "Lee", "4155550150", "friend"),
    add_contact(2, "Mina", "Sato", "4155550151", "coworker"),
    coworker_note(),
    tagged_notes(),
    manager_phone(),
]
