"""The lookup band, difficulty 1: one app and one API that no `easy` gold solution calls, so
the agent has to find it (the app's API list, then its documentation) rather than recall it.
A program a small model can write once it knows the API's name and arguments: the band where
reading the documentation pays at the scale of SmolLM2-135M, beside the difficulty-2 lookup
scenarios (train_multi.py, train_chains.py) whose programs it cannot write.

Every variant belongs to the band: 1-3 and 7 more to `lookup`, 8 to `lookup_heldout` (more held
out than the difficulty-2 scenarios' 5, so that a config on this part alone,
`max_difficulty: 1`, evaluates on 32 tasks)."""

from __future__ import annotations

import sqlite3
from typing import Any

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import Scenario, Variant, add_email, days_ago, login_cell
from tasks.apptown.world import World

LOOKUP_SINGLE_BANDS: tuple[tuple[str, int], ...] = (("lookup_heldout", 8), ("lookup", 7))


class PaymentsCountFriends(Scenario):
    id = "payments_count_friends"
    difficulty = 1
    apps = ("payments",)
    split = "lookup"
    more_variants = LOOKUP_SINGLE_BANDS
    mistake = "counts only the first page of friends"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT person_id FROM payments_friends GROUP BY person_id HAVING count(*) > 5"
        )
        users = self.pick_users(world, [r["person_id"] for r in rows])
        wordings = (
            "How many friends do I have in the payments app?",
            "Count my friends on payments and tell me the number.",
            "What is the total number of my payments friends?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            "friends = all_pages(apis.payments.show_friends)\nprint(len(friends))",
            "apis.supervisor.complete_task(answer=len(friends))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            "friends = apis.payments.show_friends()\n"
            "apis.supervisor.complete_task(answer=len(friends))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before(
            "SELECT count(*) AS n FROM payments_friends WHERE person_id = ?", (v.user_id,)
        )
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class MusicCountLikedSongs(Scenario):
    id = "music_count_liked_songs"
    difficulty = 1
    apps = ("music",)
    split = "lookup"
    more_variants = LOOKUP_SINGLE_BANDS
    mistake = "counts the songs in the library instead of the liked ones"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT person_id FROM music_likes l GROUP BY person_id HAVING count(*) > 5 AND "
            "count(*) != (SELECT count(*) FROM music_library b WHERE b.person_id = l.person_id)"
        )
        users = self.pick_users(world, [r["person_id"] for r in rows])
        wordings = (
            "How many songs have I liked in my music app?",
            "Count the songs I liked on music and tell me the number.",
            "What is the number of liked songs in my music account?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "liked = all_pages(apis.music.show_liked_songs)\nprint(len(liked))",
            "apis.supervisor.complete_task(answer=len(liked))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "library = all_pages(apis.music.show_library)\n"
            "apis.supervisor.complete_task(answer=len(library))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before("SELECT count(*) AS n FROM music_likes WHERE person_id = ?", (v.user_id,))
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class PaymentsCountPendingReceived(Scenario):
    id = "payments_count_pending_received"
    difficulty = 1
    apps = ("payments",)
    split = "lookup"
    more_variants = LOOKUP_SINGLE_BANDS
    mistake = "counts every received request, paid and declined ones too"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT payer_id FROM payments_requests GROUP BY payer_id "
            "HAVING sum(status = 'pending') >= 1 AND sum(status != 'pending') >= 1"
        )
        users = self.pick_users(world, [r["payer_id"] for r in rows])
        wordings = (
            "How many payment requests sent to me are still pending?",
            "Count the payment requests I received that I have not answered yet.",
            "What is the number of pending payment requests others have sent me?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            'pending = all_pages(apis.payments.show_received_payment_requests, status="pending")'
            "\nprint(len(pending))",
            "apis.supervisor.complete_task(answer=len(pending))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            "received = all_pages(apis.payments.show_received_payment_requests)\n"
            "apis.supervisor.complete_task(answer=len(received))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before(
            "SELECT count(*) AS n FROM payments_requests WHERE payer_id = ? AND status = 'pending'",
            (v.user_id,),
        )
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class EmailStarLatestFrom(Scenario):
    id = "email_star_latest_from"
    difficulty = 1
    apps = ("email",)
    split = "lookup"
    more_variants = LOOKUP_SINGLE_BANDS
    mistake = "stars the sender's oldest email instead of the latest"

    # The emails the setup delivers from the sender, newest first: (days ago, subject).
    EMAILS = ((1.5, "Quick question"), (5, "Photos from the weekend"), (11, "Old notes"))

    def variants(self, world: World) -> list[Variant]:
        wordings = (
            "Star the most recent email {name} sent me.",
            "Please star the latest email I got from {name}.",
            "Find the newest email from {name} in my inbox and star it.",
        )
        users, params = friend_senders(self, world)
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        for days, subject in self.EMAILS:
            add_email(
                db, v["sender_id"], v.user_id, subject, "See you soon!", days_ago(world, days)
            )

    def gold(self, v: Variant) -> list[str]:
        return latest_from_cells(v, "star_email", 0)

    def wrong(self, v: Variant) -> list[str]:
        return latest_from_cells(v, "star_email", -1)

    def evaluate(self, g: Grader, v: Variant) -> None:
        check_latest_flagged(g, v, "is_starred", "starred")


def friend_senders(scenario: Scenario, world: World) -> tuple[list[int], list[dict[str, Any]]]:
    """The scenario's users and, for each, a friend of theirs who sent them emails (the
    setup's): `sender_id` and `name`."""
    users = scenario.pick_users(world, [p.id for p in world.society.people])
    params = []
    for user, rng in zip(users, scenario.variant_rngs(world), strict=True):
        sender = world.person(rng.choice(world.society.related(user, "friend")))
        params.append({"sender_id": sender.id, "name": sender.name})
    return users, params


def latest_from_cells(v: Variant, api: str, index: int) -> list[str]:
    """Log in, find the sender's emails in the inbox (newest first), call `email.api` on the
    one at `index` (0: the latest, the gold; -1: the oldest, the wrong solution), complete."""
    find = (
        "emails = all_pages(apis.email.show_inbox)\n"
        f'theirs = [e for e in emails if e["sender_name"] == "{v["name"]}"]\n'
        "print(theirs)"
    )
    act = f'apis.email.{api}(email_id=theirs[{index}]["email_id"])\napis.supervisor.complete_task()'
    return [login_cell("email"), find, act]


def check_latest_flagged(g: Grader, v: Variant, column: str, flagged: str) -> None:
    """The sender's latest email in the inbox has `column` set (and nothing else changed)."""
    latest = g.before(
        "SELECT r.id, r.email_id FROM email_emails e JOIN email_recipients r ON "
        "r.email_id = e.id WHERE e.sender_id = ? AND r.person_id = ? AND r.is_archived = 0 "
        "ORDER BY e.sent_at DESC, e.id DESC LIMIT 1",
        (v["sender_id"], v.user_id),
    )[0]
    after = g.after(f"SELECT {column} FROM email_recipients WHERE id = ?", (latest["id"],))
    g.check(
        f"latest_{flagged}",
        f"Email {latest['email_id']}, the latest from {v['name']}, is {flagged}",
        bool(after and after[0][column]),
        f"email {latest['email_id']} is not {flagged}",
    )
    g.check_no_other_changes({"email_recipients": {latest["id"]: (column,)}})


LOOKUP_SINGLE: tuple[Scenario, ...] = (
    PaymentsCountFriends(),
    MusicCountLikedSongs(),
    PaymentsCountPendingReceived(),
    EmailStarLatestFrom(),
)
