"""Train split, difficulty 2-3: read something in one app, act on it in another (a text asking
for money, a manager's email, a bill to split between roommates)."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    LOOKUP_BANDS,
    Scenario,
    Variant,
    add_email,
    contacts_with,
    days_ago,
    ids,
    login_cell,
    people_with,
    person_ids,
)
from tasks.apptown.world import World, insert_row

# Who asks for money and what for: variants 1-3, then the `more_variants` cycling through the
# three relationships with other things (lowercase, no "?": the gold reads "for the <thing>?").
ASKS = (("partner", "concert tickets"), ("manager", "team lunch"), ("sibling", "birthday cake"))
MORE_THINGS = ("taxi ride", "museum tickets", "pizza night", "train tickets", "picnic food")


def _account_ids(g: Grader, people: list[int]) -> list[int]:
    marks = ", ".join("?" for _ in people)
    return ids(
        g.before(f"SELECT id FROM payments_accounts WHERE person_id IN ({marks})", tuple(people))
    )


class PaymentsPayTextRequest(Scenario):
    id = "payments_pay_text_request"
    difficulty = 2
    apps = ("phone", "payments")
    split = "train"
    more_variants = LOOKUP_BANDS
    mistake = "pays whoever sent the latest money request, without checking who it is"

    def variants(self, world: World) -> list[Variant]:
        users: list[int] = []
        params: list[dict[str, Any]] = []
        rng = self.rng(world)  # variants 1-3 draw from it in this order, as they always did
        for label, thing in ASKS:
            self._ask(world, rng, label, thing, users, params)
        more = self.rng(world, "more")
        for i in range(self.num_variants - 3):
            label = ASKS[i % len(ASKS)][0]
            self._ask(world, more, label, MORE_THINGS[i % len(MORE_THINGS)], users, params)
        wordings = (
            "My {label} texted me asking for money. Send them the amount they asked for "
            "through payments, with what it is for as the description.",
            "Pay my {label} back on payments: they sent me a text saying how much they "
            "need and what for. Use that as the description.",
            "Check the text where my {label} asks me for money and send exactly that "
            "amount via payments, describing it as they did.",
            # a fourth for the `more_variants`, so that wordings and relationships pair anew
            "Read the text in which my {label} asks me for money and pay them that amount on "
            "payments, with the reason they gave as the description.",
        )
        return self.make_variants(users, wordings, params)

    @staticmethod
    def _ask(
        world: World,
        rng: random.Random,
        label: str,
        thing: str,
        users: list[int],
        params: list[dict[str, Any]],
    ) -> None:
        """Add a variant: a new user with exactly one `label`, who asks for `thing`, and a
        friend of theirs (not their `label`) whose later text asks for other money."""
        related = world.society.related
        candidates = [
            p.id
            for p in world.society.people
            if len(related(p.id, label)) == 1 and p.id not in users
        ]
        users.append(rng.choice(candidates))
        friends = [f for f in related(users[-1], "friend") if f not in related(users[-1], label)]
        params.append(
            {
                "label": label,
                "thing": thing,
                "relative_id": related(users[-1], label)[0],
                "amount": rng.randint(12, 45) + 0.5,
                "other_id": rng.choice(friends),
            }
        )

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        texts = (
            (
                v["relative_id"],
                f"Hi! Could you send me ${v['amount']:.2f} for the {v['thing']}? Thanks!",
                2.0,
            ),
            (v["other_id"], "Hey, can you send me $60.00 for the parking fine?", 0.5),
        )
        for sender, body, days in texts:
            insert_row(
                db,
                "phone_messages",
                sender_id=sender,
                receiver_id=v.user_id,
                body=body,
                sent_at=days_ago(world, days),
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "payments"),
            f'relative = all_pages(apis.phone.search_contacts, relationship="{v["label"]}")'
            "[0]\ntexts = all_pages(apis.phone.show_text_messages, "
            'phone_number=relative["phone_number"])\n'
            'asks = [t for t in texts if t["sender_phone_number"] == relative["phone_number"]'
            ' and "$" in t["body"]]\nprint(asks[0]["body"])',
            "import re\n"
            'amount = float(re.search(r"\\$([\\d.]+)", asks[0]["body"]).group(1))\n'
            'reason = re.search(r"for the ([^?]+)", asks[0]["body"]).group(1)\n'
            'apis.payments.send_money(receiver_email=relative["email"], amount=amount, '
            "description=reason)",
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = (
            "texts = all_pages(apis.phone.show_text_messages)\n"
            'asks = [t for t in texts if "$" in t["body"] and '
            't["receiver_phone_number"] == profile["phone_number"]]\n'
            'relative = apis.phone.search_contacts(query=asks[0]["sender_phone_number"])'
            "[0]"
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        sent = [t for t in g.diff.added("payments_transactions") if t["sender_id"] == v.user_id]
        ok = (
            len(sent) == 1
            and sent[0]["receiver_id"] == v["relative_id"]
            and abs(sent[0]["amount"] - v["amount"]) < 0.005
        )
        g.check(
            "paid_relative",
            f"Exactly one payment of {v['amount']:.2f} was sent to the user's {v['label']}",
            ok,
            f"payments sent: {sent}",
        )
        g.check(
            "description",
            f"Its description mentions {v['thing']!r}",
            len(sent) == 1 and v["thing"] in sent[0]["description"].lower(),
            f"descriptions: {[t['description'] for t in sent]}",
        )
        accounts = _account_ids(g, [v.user_id, v["relative_id"]])
        g.check_no_other_changes(
            {
                "payments_transactions": ids(sent[:1]),
                "payments_accounts": {account: ("balance",) for account in accounts},
            }
        )


class EmailReplyManager(Scenario):
    id = "email_reply_manager"
    difficulty = 2
    apps = ("phone", "email")
    split = "train"
    mistake = "replies to the newest email in the inbox, assuming it is the manager's"

    def variants(self, world: World) -> list[Variant]:
        related = world.society.related
        users = self.pick_users(
            world, [p.id for p in world.society.people if related(p.id, "manager")]
        )
        texts = (
            "Sounds good, I will have it ready by Friday.",
            "Thanks, I am on it.",
            "Got it. See you at the meeting.",
        )
        params = [
            {
                "text": t,
                "manager_id": related(u, "manager")[0],
                "coworker_id": related(u, "coworker")[0],
            }
            for u, t in zip(users, texts, strict=True)
        ]
        wordings = (
            "Reply to the most recent email from my manager with: '{text}'",
            "Answer my manager's latest email. The reply should say exactly: '{text}'",
            "Send '{text}' as a reply to the newest email my manager sent me.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        for sender, subject, days in (
            (v["manager_id"], "Q3 planning", 3.0),
            (v["manager_id"], "Slides for the review", 0.2),
            (v["coworker_id"], "Lunch today?", 0.1),
        ):
            add_email(
                db, sender, v.user_id, subject, "Let me know what you think.", days_ago(world, days)
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "email"),
            'manager = all_pages(apis.phone.search_contacts, relationship="manager")[0]\n'
            'latest = apis.email.show_inbox(sender_email=manager["email"], '
            "include_archived=True, page_limit=1)[0]\nprint(latest)",
            f'apis.email.reply_to_email(email_id=latest["email_id"], body="{v["text"]}")',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = "latest = apis.email.show_inbox(page_limit=1)[0]"
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        latest = g.before(
            "SELECT e.* FROM email_emails e JOIN email_recipients r ON r.email_id "
            "= e.id WHERE e.sender_id = ? AND r.person_id = ? ORDER BY e.sent_at "
            "DESC, e.id DESC LIMIT 1",
            (v["manager_id"], v.user_id),
        )[0]
        sent = [e for e in g.diff.added("email_emails") if e["sender_id"] == v.user_id]
        recipients = [r for r in g.diff.added("email_recipients") if r["email_id"] in ids(sent)]
        ok = (
            len(sent) == 1
            and sent[0]["thread_id"] == latest["thread_id"]
            and [r["person_id"] for r in recipients] == [v["manager_id"]]
        )
        g.check(
            "replied_in_thread",
            f"One reply to the manager's email {latest['id']} "
            f"({latest['subject']!r}) was sent, in its thread",
            ok,
            f"emails sent: {[(e['subject'], e['thread_id']) for e in sent]}",
        )
        g.check(
            "reply_text",
            f"The reply says {v['text']!r}",
            [e["body"].strip() for e in sent] == [v["text"]],
            f"bodies: {[e['body'] for e in sent]}",
        )
        g.check_no_other_changes(
            {"email_emails": ids(sent[:1]), "email_recipients": ids(recipients)}
        )


class PaymentsSplitBillRoommates(Scenario):
    id = "payments_split_bill_roommates"
    difficulty = 3
    apps = ("phone", "payments")
    split = "train"
    mistake = "divides the bill by the number of roommates, leaving the user out"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world, [p.id for p in world.society.people if world.society.related(p.id, "roommate")]
        )
        rng = self.rng(world)
        params = []
        for user, thing in zip(
            users, ("internet bill", "cleaning supplies", "electricity bill"), strict=True
        ):
            n = len(people_with(world, user, "roommate"))
            share = rng.randint(15, 60) + rng.choice((0.0, 0.25, 0.5, 0.75))
            params.append({"thing": thing, "total": f"{share * (n + 1):.2f}"})
        wordings = (
            "I paid ${total} for the {thing}. Split it evenly between me and my "
            "roommates and send each roommate a payment request for their share, with "
            "the description '{thing}'.",
            "The {thing} came to ${total}, which I covered. Everyone in the flat (my "
            "roommates and me) pays an equal part: request each roommate's part on "
            "payments, described as '{thing}'.",
            "Request money from my roommates for the {thing} (${total} in total, shared "
            "equally by all of us including me). Use '{thing}' as the description.",
        )
        return self.make_variants(users, wordings, params)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "payments"),
            'roommates = all_pages(apis.phone.search_contacts, relationship="roommate")\n'
            f"share = round({v['total']} / (len(roommates) + 1), 2)\nprint(share)",
            "for r in roommates:\n"
            '    apis.payments.create_payment_request(user_email=r["email"], amount=share, '
            f'description="{v["thing"]}")',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace("(len(roommates) + 1)", "len(roommates)")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        roommates = contacts_with(g, v.user_id, "roommate")
        share = round(float(v["total"]) / (len(roommates) + 1), 2)
        payers = {pid: email for email, pid in person_ids(g).items()}
        expected = sorted((r["email"], share, v["thing"]) for r in roommates)
        new = [r for r in g.diff.added("payments_requests") if r["requester_id"] == v.user_id]
        got = sorted((payers[r["payer_id"]], r["amount"], r["description"]) for r in new)
        g.check(
            "requests_sent",
            f"Each roommate got one request of {share:.2f} described as "
            f"{v['thing']!r}, and nobody else did",
            got == expected,
            f"requests: {got}, expected {expected}",
        )
        g.check_no_other_changes({"payments_requests": ids(new)})


TRAIN_CHAINS: tuple[Scenario, ...] = (
    PaymentsPayTextRequest(),
    EmailReplyManager(),
    PaymentsSplitBillRoommates(),
)
