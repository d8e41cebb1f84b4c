"""Test-challenge split: longer chains that all use the `todo` app, which no train scenario uses
(as AppWorld's Test-C uses apps unseen in training)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    Scenario,
    Variant,
    add_email,
    columns,
    days_ago,
    ids,
    login_cell,
)
from tasks.apptown.world import World, insert_row

FIND_LIST = (
    'todo_list = next(x for x in all_pages(apis.todo.show_lists) if x["name"] == '
    '"{name}")\nlist_id = todo_list["list_id"]'
)


def add_list(db: sqlite3.Connection, world: World, owner: int, name: str) -> int:
    return insert_row(db, "todo_lists", owner_id=owner, name=name, created_at=days_ago(world, 9))


def add_item(
    db: sqlite3.Connection,
    world: World,
    list_id: int,
    title: str,
    due: int | None,
    done: bool = False,
) -> int:
    """An item due `due` days from today (negative: overdue)."""
    due_date = None if due is None else (world.now.date() + timedelta(days=due)).isoformat()
    return insert_row(
        db,
        "todo_items",
        list_id=list_id,
        title=title,
        notes="",
        due_date=due_date,
        priority="normal",
        is_completed=int(done),
        completed_at=days_ago(world, 1) if done else None,
        created_at=days_ago(world, 30),
    )


def list_items(g: Grader, owner: int, name: str) -> list[dict]:
    return g.before(
        "SELECT i.* FROM todo_items i JOIN todo_lists l ON l.id = i.list_id WHERE "
        "l.owner_id = ? AND l.name = ? ORDER BY i.due_date, i.id",
        (owner, name),
    )


def new_items(g: Grader, owner: int, name: str) -> list[dict]:
    lists = ids(g.after("SELECT id FROM todo_lists WHERE owner_id = ? AND name = ?", (owner, name)))
    return [i for i in g.diff.added("todo_items") if i["list_id"] in lists]


class TodoItemsFromActionEmails(Scenario):
    id = "todo_items_from_action_emails"
    difficulty = 3
    apps = ("email", "todo")
    split = "test_challenge"
    mistake = "reads only the first page of the inbox"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        params = [{"list": n} for n in ("Inbox tasks", "Follow-ups", "From email")]
        wordings = (
            "For every email in my inbox whose subject starts with 'Action:', add an item "
            "to my '{list}' to-do list titled with the rest of the subject.",
            "Turn each email whose subject begins with 'Action:' into a to-do item in my "
            "'{list}' list; the item title is the subject without 'Action:'.",
            "My '{list}' to-do list should get one item per 'Action:' email in my inbox, "
            "named after the subject minus the 'Action: ' prefix.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        add_item(db, world, add_list(db, world, v.user_id, v["list"]), "Sort old mail", 3)
        senders = world.society.related(v.user_id, "coworker") or world.society.related(
            v.user_id, "friend"
        )
        jobs = (
            "Review budget",
            "Sign the contract",
            "Book the venue",
            "Send slides",
            "Renew parking permit",
            "Approve time off",
        )
        for i, job in enumerate(jobs):
            add_email(
                db,
                senders[i % len(senders)],
                v.user_id,
                f"Action: {job}",
                "Please take care of this.",
                days_ago(world, 1 + 2 * i),
            )
        add_email(
            db,
            senders[0],
            v.user_id,
            "Re: Action: Old request",
            "Done already.",
            days_ago(world, 0.5),
        )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("email", "todo"),
            'emails = all_pages(apis.email.show_inbox, query="Action:")\n'
            'jobs = [e["subject"][len("Action:"):].strip() for e in emails '
            'if e["subject"].startswith("Action:")]\nprint(jobs)',
            FIND_LIST.format(name=v["list"]) + "\nfor job in jobs:\n"
            "    apis.todo.add_item(list_id=list_id, title=job)",
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace("all_pages(apis.email.show_inbox, ", "apis.email.show_inbox(")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        expected = sorted(
            e["subject"][len("Action:") :].strip()
            for e in g.before(
                "SELECT e.subject FROM email_emails e JOIN email_recipients r ON r.email_id = e.id "
                "WHERE r.person_id = ? AND r.is_archived = 0 AND e.subject LIKE 'Action:%'",
                (v.user_id,),
            )
        )
        new = new_items(g, v.user_id, v["list"])
        got = sorted(i["title"] for i in new)
        g.check(
            "items_added",
            f"The '{v['list']}' list got one item per 'Action:' email",
            got == expected,
            f"added {got}, expected {expected}",
        )
        g.check_no_other_changes({"todo_items": ids(new)})


class TodoCompleteOverdue(Scenario):
    id = "todo_complete_overdue"
    difficulty = 2
    apps = ("todo",)
    split = "test_challenge"
    mistake = "completes only the overdue items on the first page"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        today = world.now.date().isoformat()
        params = [{"list": n, "today": today} for n in ("Errands", "Chores", "Admin")]
        wordings = (
            "Mark as completed every item in my '{list}' to-do list that was due before today.",
            "In my '{list}' list, complete all the open items whose due date has passed.",
            "Tick off every overdue item (due before today) in my '{list}' to-do list.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        list_id = add_list(db, world, v.user_id, v["list"])
        for k in range(7):
            add_item(db, world, list_id, f"Overdue task {k + 1}", -1 - 2 * k)
        add_item(db, world, list_id, "Already done", -4, done=True)
        add_item(db, world, list_id, "Due today", 0)
        add_item(db, world, list_id, "Next week", 7)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("todo"),
            FIND_LIST.format(name=v["list"]),
            "items = all_pages(apis.todo.show_items, list_id=list_id, is_completed=False)\n"
            "for item in items:\n"
            f'    if item["due_date"] and item["due_date"] < "{v["today"]}":\n'
            '        apis.todo.complete_item(item_id=item["item_id"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = cells[2].replace("all_pages(apis.todo.show_items, ", "apis.todo.show_items(")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        due = [
            i
            for i in list_items(g, v.user_id, v["list"])
            if not i["is_completed"] and i["due_date"] is not None and i["due_date"] < v["today"]
        ]
        done = {i["id"] for i in g.after("SELECT id FROM todo_items WHERE is_completed = 1")}
        missed = [i["title"] for i in due if i["id"] not in done]
        g.check(
            "overdue_completed",
            f"All {len(due)} overdue open items of '{v['list']}' are completed",
            not missed,
            f"still open: {missed}",
        )
        g.check_no_other_changes({"todo_items": columns(due, "is_completed", "completed_at")})


class TodoRequestLentMoney(Scenario):
    id = "todo_request_lent_money"
    difficulty = 3
    apps = ("todo", "phone", "payments")
    split = "test_challenge"
    mistake = "also requests money for items that are already completed"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world,
            [p.id for p in world.society.people if len(world.society.related(p.id, "friend")) >= 4],
        )
        rng = self.rng(world)
        params = []
        for user in users:
            friends = rng.sample(world.society.related(user, "friend"), 4)
            params.append(
                {"loans": [(f, rng.randint(10, 80), k < 3) for k, f in enumerate(friends)]}
            )
        wordings = (
            "My 'Lent money' to-do list has items like 'Lent $20 to Name'. For each item "
            "that is not completed, send that person a payment request for the amount "
            "with the description 'Money I lent you', then mark the item as completed.",
            "Collect my loans: for every open item in my 'Lent money' to-do list (they "
            "read 'Lent $<amount> to <name>'), request the amount from that person on "
            "payments with description 'Money I lent you' and complete the item.",
            "Go through the unfinished items of my 'Lent money' list. Each says who I "
            "lent how much; request it back on payments (description 'Money I lent "
            "you') and tick the item off.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        list_id = add_list(db, world, v.user_id, "Lent money")
        for k, (friend, amount, is_open) in enumerate(v["loans"]):
            add_item(
                db,
                world,
                list_id,
                f"Lent ${amount} to {world.person(friend).name}",
                -5 + k,
                done=not is_open,
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("todo", "phone", "payments"),
            FIND_LIST.format(name="Lent money"),
            "import re\n"
            "items = all_pages(apis.todo.show_items, list_id=list_id, is_completed=False)\n"
            "for item in items:\n"
            '    amount, name = re.match(r"Lent \\$([\\d.]+) to (.+)", item["title"]).groups()\n'
            "    person = apis.phone.search_contacts(query=name)[0]\n"
            '    apis.payments.create_payment_request(user_email=person["email"], '
            'amount=float(amount), description="Money I lent you")\n'
            '    apis.todo.complete_item(item_id=item["item_id"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = cells[2].replace(", is_completed=False", "")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        want = sorted((f, float(a), "Money I lent you") for f, a, is_open in v["loans"] if is_open)
        new = [r for r in g.diff.added("payments_requests") if r["requester_id"] == v.user_id]
        got = sorted((r["payer_id"], r["amount"], r["description"]) for r in new)
        g.check(
            "requests_sent",
            "One request per open loan, for its amount, to its borrower",
            got == want,
            f"requests {got}, expected {want}",
        )
        items = [i for i in list_items(g, v.user_id, "Lent money") if not i["is_completed"]]
        done = {i["id"] for i in g.after("SELECT id FROM todo_items WHERE is_completed = 1")}
        g.check(
            "items_completed",
            "Every open loan item is marked completed",
            all(i["id"] in done for i in items),
            f"still open: {[i['title'] for i in items if i['id'] not in done]}",
        )
        g.check_no_other_changes(
            {
                "payments_requests": ids(new),
                "todo_items": columns(items, "is_completed", "completed_at"),
            }
        )
