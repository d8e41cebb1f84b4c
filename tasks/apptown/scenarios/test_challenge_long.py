"""Test-challenge split, continued: todo combined with files, phone birthdays and email."""

from __future__ import annotations

import json
import sqlite3
from datetime import date, timedelta

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    Scenario,
    Variant,
    contacts_with,
    days_ago,
    ids,
    login_cell,
    person_ids,
)
from tasks.apptown.scenarios.test_challenge import (
    FIND_LIST,
    TodoCompleteOverdue,
    TodoItemsFromActionEmails,
    TodoRequestLentMoney,
    add_item,
    add_list,
    new_items,
)
from tasks.apptown.world import World, insert_row

FAMILY = ("parent", "sibling", "child", "partner")


class FilesTodoFromFile(Scenario):
    id = "files_todo_from_file"
    difficulty = 3
    apps = ("files", "todo")
    split = "test_challenge"
    mistake = "imports every line, including the header and the dashes"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        params = [
            {
                "name": "Groceries",
                "path": "/documents/groceries.txt",
                "entries": ["milk", "eggs", "spinach", "rice", "coffee beans", "lemons", "tofu"],
            },
            {
                "name": "Camping gear",
                "path": "/documents/camping.txt",
                "entries": ["tent", "sleeping bag", "headlamp", "stove", "water filter", "map"],
            },
            {
                "name": "Gift ideas",
                "path": "/notes/gifts.txt",
                "entries": ["scarf", "board game", "cookbook", "plant", "concert tickets", "mug"],
            },
        ]
        wordings = (
            "Create a to-do list named '{name}' and add one item per entry of my file "
            "{path} (the lines starting with '- ', without the dash).",
            "Make a new to-do list '{name}' from my file {path}: each '- ' line of the "
            "file becomes an item (drop the leading dash).",
            "Read {path} in my files and copy its '- ' entries into a new to-do list "
            "called '{name}', one item each, without the '- '.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        text = f"{v['name']} for this month:\n\n" + "".join(f"- {e}\n" for e in v["entries"])
        insert_row(
            db,
            "files_files",
            owner_id=v.user_id,
            path=v["path"],
            content=text,
            created_at=days_ago(world, 6),
            updated_at=days_ago(world, 6),
        )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("files", "todo"),
            f'text = apis.files.show_file(path="{v["path"]}")["content"]\nprint(text)',
            "entries = [line[2:].strip() for line in text.splitlines() "
            'if line.startswith("- ")]\n'
            f'new_list = apis.todo.create_list(name="{v["name"]}")\n'
            "for entry in entries:\n"
            '    apis.todo.add_item(list_id=new_list["id"], title=entry)',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = cells[2].replace(
            'entries = [line[2:].strip() for line in text.splitlines() if line.startswith("- ")]',
            "entries = [line for line in text.splitlines() if line.strip()]",
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        lists = [x for x in g.diff.added("todo_lists") if x["owner_id"] == v.user_id]
        g.check(
            "list_created",
            f"One new to-do list named {v['name']!r}",
            [x["name"] for x in lists] == [v["name"]],
            f"new lists: {lists}",
        )
        new = new_items(g, v.user_id, v["name"])
        got = sorted(i["title"] for i in new)
        g.check(
            "items_added",
            "It holds exactly the file's entries",
            got == sorted(v["entries"]),
            f"items {got}, expected {sorted(v['entries'])}",
        )
        g.check_no_other_changes({"todo_lists": ids(lists[:1]), "todo_items": ids(new)})


def _next_birthday(birthday: str, today: date) -> date:
    born = date.fromisoformat(birthday)
    return born.replace(year=today.year)


class TodoBirthdayCalls(Scenario):
    id = "todo_birthday_calls"
    difficulty = 3
    apps = ("phone", "todo")
    split = "test_challenge"
    mistake = "adds calls for every contact with a birthday soon, not only family"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world, [p.id for p in world.society.people if len(self._family(world, p.id)) >= 3]
        )
        today = world.now.date().isoformat()
        wordings = (
            "Add an item 'Call <full name>' to my 'Birthdays' to-do list for every "
            "family member (parent, sibling, child or partner) whose birthday is in the "
            "next 30 days, due on their birthday.",
            "For each of my family members (parents, siblings, children, partner) with "
            "a birthday within 30 days from today, add 'Call <first> <last>' to my "
            "'Birthdays' list, due that day.",
            "Put a 'Call <full name>' item, due on the birthday, in my 'Birthdays' "
            "to-do list for every relative of mine (parent, sibling, child, partner) "
            "whose birthday comes up in the next 30 days.",
        )
        return self.make_variants(users, wordings, [{"today": today}] * 3)

    @staticmethod
    def _family(world: World, user: int) -> list[int]:
        return sorted({p for label in FAMILY for p in world.society.related(user, label)})

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        add_list(db, world, v.user_id, "Birthdays")
        family = self._family(world, v.user_id)
        friends = [f for f in world.society.related(v.user_id, "friend") if f not in family]
        today = world.now.date()
        moves = [(family[0], 5), (family[1], 21), (family[2], 45), (friends[0], 10)]
        for pid, days in moves:
            person = world.person(pid)
            day = today + timedelta(days=days)
            birthday = date(int(person.birthday[:4]), day.month, day.day).isoformat()
            db.execute(
                "UPDATE phone_contacts SET birthday = ? WHERE owner_id = ? AND email = ?",
                (birthday, v.user_id, person.email),
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "todo"),
            "from datetime import date, timedelta\n"
            f'today = date.fromisoformat("{v["today"]}")\nfamily = {{}}\n'
            f"for rel in {FAMILY!r}:\n"
            "    for c in all_pages(apis.phone.search_contacts, relationship=rel):\n"
            '        family[c["contact_id"]] = c\nprint(len(family))',
            FIND_LIST.format(name="Birthdays") + "\nfor c in family.values():\n"
            '    day = date.fromisoformat(c["birthday"]).replace(year=today.year)\n'
            "    if today <= day <= today + timedelta(days=30):\n"
            "        apis.todo.add_item(list_id=list_id, title=f\"Call {c['first_name']} "
            "{c['last_name']}\", due_date=day.isoformat())",
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(", relationship=rel", "")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        today = date.fromisoformat(v["today"])
        contacts = g.before("SELECT * FROM phone_contacts WHERE owner_id = ?", (v.user_id,))
        expected = sorted(
            (f"Call {c['first_name']} {c['last_name']}", day.isoformat())
            for c in contacts
            if set(json.loads(c["relationships"])) & set(FAMILY)
            and today <= (day := _next_birthday(c["birthday"], today)) <= today + timedelta(30)
        )
        new = new_items(g, v.user_id, "Birthdays")
        got = sorted((i["title"], i["due_date"]) for i in new)
        g.check(
            "calls_added",
            "One 'Call <name>' item per family birthday in the next 30 days, due on the birthday",
            got == expected,
            f"added {got}, expected {expected}",
        )
        g.check_no_other_changes({"todo_items": ids(new)})


class TodoStatusEmailManager(Scenario):
    id = "todo_status_email_manager"
    difficulty = 3
    apps = ("phone", "todo", "email")
    split = "test_challenge"
    mistake = "lists only the first page of open items"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world, [p.id for p in world.society.people if world.society.related(p.id, "manager")]
        )
        params = [{"list": n} for n in ("Sprint", "Q2 goals", "Launch prep")]
        wordings = (
            "Email my manager a status update with subject 'Status update' and a body "
            "listing the titles of the open items of my '{list}' to-do list, one per "
            "line, earliest due first.",
            "Send my manager an email titled 'Status update' whose body is the list of "
            "not-yet-completed items in my '{list}' list (one title per line, sorted by "
            "due date).",
            "Write to my manager (subject 'Status update'): put every open item title "
            "from my '{list}' to-do list on its own line, ordered by due date.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        list_id = add_list(db, world, v.user_id, v["list"])
        tasks = (
            "Draft proposal",
            "Fix login bug",
            "Write tests",
            "Update docs",
            "Demo prep",
            "Retro notes",
            "Ship release",
            "Plan offsite",
        )
        for k, title in enumerate(tasks):
            add_item(db, world, list_id, title, (k * 5) % 17 - 3, done=k in (2, 5))

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "todo", "email"),
            'manager = all_pages(apis.phone.search_contacts, relationship="manager")[0]\n'
            + FIND_LIST.format(name=v["list"])
            + "\n"
            "items = all_pages(apis.todo.show_items, list_id=list_id, is_completed=False)\n"
            'body = "\\n".join(i["title"] for i in items)\nprint(body)',
            'apis.email.send_email(recipients=[manager["email"]], subject="Status update", '
            "body=body)",
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace("all_pages(apis.todo.show_items, ", "apis.todo.show_items(")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        manager = contacts_with(g, v.user_id, "manager")[0]
        manager_id = person_ids(g)[manager["email"]]
        titles = [
            i["title"]
            for i in g.before(
                "SELECT i.title FROM todo_items i JOIN todo_lists l ON l.id = i.list_id WHERE "
                "l.owner_id = ? AND l.name = ? AND i.is_completed = 0 ORDER BY i.due_date, i.id",
                (v.user_id, v["list"]),
            )
        ]
        sent = [e for e in g.diff.added("email_emails") if e["sender_id"] == v.user_id]
        recipients = [r for r in g.diff.added("email_recipients") if r["email_id"] in ids(sent)]
        g.check(
            "emailed_manager",
            "One email with subject 'Status update' went to the manager",
            [e["subject"] for e in sent] == ["Status update"]
            and [r["person_id"] for r in recipients] == [manager_id],
            f"sent {[e['subject'] for e in sent]} to {[r['person_id'] for r in recipients]}",
        )
        lines = [x.strip() for e in sent for x in e["body"].splitlines() if x.strip()]
        g.check(
            "open_items_listed",
            "The body lists the open items, one per line, by due date",
            lines == titles,
            f"body lines {lines}, expected {titles}",
        )
        g.check_no_other_changes(
            {"email_emails": ids(sent[:1]), "email_recipients": ids(recipients)}
        )


TEST_CHALLENGE: tuple[Scenario, ...] = (
    TodoItemsFromActionEmails(),
    TodoCompleteOverdue(),
    TodoRequestLentMoney(),
    FilesTodoFromFile(),
    TodoBirthdayCalls(),
    TodoStatusEmailManager(),
)
