"""Test-normal split: held-out scenarios over the apps training uses (phone, payments, music,
email)."""

from __future__ import annotations

import sqlite3

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    Scenario,
    Variant,
    columns,
    days_ago,
    ids,
    login_cell,
)
from tasks.apptown.world import World, insert_row


class PaymentsDeclineNonContacts(Scenario):
    id = "payments_decline_non_contacts"
    difficulty = 2
    apps = ("phone", "payments")
    split = "test_normal"
    mistake = "reads only the first page of contacts, so it declines requests from contacts"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        wordings = (
            "Decline every pending payment request I received from people who are not "
            "in my phone contacts.",
            "I got payment requests from strangers. Decline the pending ones that come "
            "from anyone not saved in my phone contacts.",
            "Go through my pending received payment requests and decline those whose "
            "sender is not one of my phone contacts.",
        )
        return self.make_variants(users, wordings, [{}, {}, {}])

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        rng = self.rng(world)
        contacts = db.execute(
            "SELECT p.id FROM phone_contacts c JOIN people p ON p.email = "
            "c.email WHERE c.owner_id = ? ORDER BY c.first_name, c.last_name",
            (v.user_id,),
        ).fetchall()
        known = [r["id"] for r in contacts]
        strangers = [p.id for p in world.society.people if p.id not in [*known, v.user_id]]
        for requester in rng.sample(strangers, 3) + known[-3:]:
            insert_row(
                db,
                "payments_requests",
                requester_id=requester,
                payer_id=v.user_id,
                amount=round(rng.uniform(10, 99), 2),
                description="event tickets",
                created_at=days_ago(world, rng.uniform(1, 9)),
                status="pending",
                reminded_at=None,
                resolved_at=None,
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "payments"),
            'known = {c["email"] for c in all_pages(apis.phone.search_contacts)}\n'
            "pending = all_pages(apis.payments.show_received_payment_requests, "
            'status="pending")\nprint(len(known), len(pending))',
            "for r in pending:\n"
            '    if r["requester_email"] not in known:\n'
            "        apis.payments.decline_payment_request("
            'payment_request_id=r["payment_request_id"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(
            "all_pages(apis.phone.search_contacts)", "apis.phone.search_contacts()"
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        known = {
            c["email"]
            for c in g.before("SELECT email FROM phone_contacts WHERE owner_id = ?", (v.user_id,))
        }
        due = [
            r
            for r in g.before(
                "SELECT q.id, p.email FROM payments_requests q JOIN people p ON p.id = "
                "q.requester_id WHERE q.payer_id = ? AND q.status = 'pending'",
                (v.user_id,),
            )
            if r["email"] not in known
        ]
        status = {r["id"]: r["status"] for r in g.after("SELECT id, status FROM payments_requests")}
        missed = [r["id"] for r in due if status[r["id"]] != "declined"]
        g.check(
            "strangers_declined",
            "Every pending request from a non-contact was declined",
            not missed,
            f"not declined: {missed}",
        )
        g.check_no_other_changes({"payments_requests": columns(due, "status", "resolved_at")})


class MusicMostPlayedLibrary(Scenario):
    id = "music_most_played_library"
    difficulty = 1
    apps = ("music",)
    split = "test_normal"
    mistake = "looks only at the first page of the library"

    def variants(self, world: World) -> list[Variant]:
        candidates = []
        for p in world.society.people:
            counts = [s["play_count"] for s in world.library_songs(p.id)]
            if max(counts) not in counts[:5]:
                candidates.append(p.id)
        users = self.pick_users(world, candidates)
        wordings = (
            "Which song in my music library has been played the most? Answer with its title.",
            "Find the song with the highest play count in my music library and tell me its title.",
            "What is the title of the most played song in my library on music?",
        )
        return self.make_variants(users, wordings, [{}, {}, {}])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "library = all_pages(apis.music.show_library)\n"
            'top = max(library, key=lambda s: s["play_count"])\nprint(top)',
            'apis.supervisor.complete_task(answer=top["title"])',
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(
            "all_pages(apis.music.show_library)", "apis.music.show_library()"
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        top = g.before(
            "SELECT s.title FROM music_library l JOIN music_songs s ON s.id = "
            "l.song_id WHERE l.person_id = ? ORDER BY s.play_count DESC LIMIT 1",
            (v.user_id,),
        )
        g.check_answer(top[0]["title"])
        g.check_no_other_changes()


class PhoneUpdateContactEmail(Scenario):
    id = "phone_update_contact_email"
    difficulty = 1
    apps = ("phone",)
    split = "test_normal"
    mistake = "deletes and re-adds the contact, losing its id and relationships"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        rng = self.rng(world)
        params = []
        for user in users:
            friend = world.person(rng.choice(world.society.related(user, "friend")))
            params.append(
                {
                    "name": friend.name,
                    "first": friend.first_name,
                    "last": friend.last_name,
                    "phone": friend.phone_number,
                    "new": f"{friend.first_name.lower()}.{rng.randint(10, 99)}@newmail.net",
                }
            )
        wordings = (
            "{name} has a new email address: {new}. Update it in my phone contacts.",
            "Change the email of my contact {name} to {new}.",
            "{name} told me their email is now {new}; please fix my phone contact.",
        )
        return self.make_variants(users, wordings, params)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone"),
            f'contact = apis.phone.search_contacts(query="{v["name"]}")[0]\nprint(contact)',
            f'apis.phone.update_contact(contact_id=contact["contact_id"], email="{v["new"]}")',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = (
            'apis.phone.delete_contact(contact_id=contact["contact_id"])\n'
            f'apis.phone.add_contact(first_name="{v["first"]}", last_name="{v["last"]}", '
            f'phone_number="{v["phone"]}", email="{v["new"]}")'
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        contact = g.before(
            "SELECT id FROM phone_contacts WHERE owner_id = ? AND first_name = ? AND last_name = ?",
            (v.user_id, v["first"], v["last"]),
        )[0]
        after = g.after("SELECT email FROM phone_contacts WHERE id = ?", (contact["id"],))
        g.check(
            "email_updated",
            f"Contact {contact['id']} ({v['name']}) has email {v['new']}",
            [r["email"] for r in after] == [v["new"]],
            f"the contact is now {after}",
        )
        g.check_no_other_changes({"phone_contacts": {contact["id"]: ("email",)}})


class PaymentsRefundDuplicate(Scenario):
    id = "payments_refund_duplicate"
    difficulty = 2
    apps = ("payments",)
    split = "test_normal"
    mistake = "requests both payments back instead of the duplicate"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        rng = self.rng(world)
        params = []
        for user, desc in zip(users, ("yoga class", "museum tickets", "car wash"), strict=True):
            payee = world.person(rng.choice(world.society.related(user, "friend")))
            params.append(
                {
                    "desc": desc,
                    "name": payee.name,
                    "payee_id": payee.id,
                    "amount": rng.randint(15, 40) + 0.25,
                }
            )
        wordings = (
            "I accidentally paid {name} twice for the {desc}. Send them a payment request "
            "for the duplicate amount, with the description '{desc} refund'.",
            "Oops, my payment to {name} for the {desc} went through two times. Request "
            "the extra payment back, described as '{desc} refund'.",
            "{name} got my payment for the {desc} twice. Ask them on payments to return "
            "one of them (description: '{desc} refund').",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        for days in (3.0, 2.99):
            insert_row(
                db,
                "payments_transactions",
                sender_id=v.user_id,
                receiver_id=v["payee_id"],
                amount=v["amount"],
                description=v["desc"],
                created_at=days_ago(world, days),
                is_private=0,
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            f'sent = all_pages(apis.payments.show_transactions, direction="sent", '
            f'query="{v["desc"]}")\n'
            f'dupes = [t for t in sent if t["receiver_name"] == "{v["name"]}"]\nprint(dupes)',
            'apis.payments.create_payment_request(user_email=dupes[0]["receiver_email"], '
            f'amount=dupes[0]["amount"], description="{v["desc"]} refund")',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = cells[2].replace(
            'amount=dupes[0]["amount"]', 'amount=sum(t["amount"] for t in dupes)'
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        new = [r for r in g.diff.added("payments_requests") if r["requester_id"] == v.user_id]
        got = [(r["payer_id"], r["amount"], r["description"]) for r in new]
        want = [(v["payee_id"], v["amount"], f"{v['desc']} refund")]
        g.check(
            "refund_requested",
            f"One request of {v['amount']:.2f} to {v['name']} described as '{v['desc']} refund'",
            got == want,
            f"requests: {got}",
        )
        g.check_no_other_changes({"payments_requests": ids(new)})


TEST_NORMAL: tuple[Scenario, ...] = (
    PaymentsDeclineNonContacts(),
    MusicMostPlayedLibrary(),
    PhoneUpdateContactEmail(),
    PaymentsRefundDuplicate(),
)
