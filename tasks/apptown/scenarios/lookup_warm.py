"""Demonstration scenarios of the lookup band's warm start (split `lookup_warm`): the `easy`
band's apps, each with APIs no `easy` gold calls and no lookup task needs (payments' social
feed, music's library, email's sent mail and archive), so that in the demonstrations one
app's API varies with what the task says, not with the app. Demonstrated with `easy`
(`warm_start.split: easy+lookup_warm`), they teach that the task's words choose the API in the
app's list; on `easy` alone each app had one or two APIs, and a policy warm-started there named
the one it remembered for the app (payments: show_balance) in every lookup task
(configs/quickstart-lookup.yaml).

Each scenario has a trap of the `easy` kind (pagination, order). No evaluation uses this split:
it exists to be demonstrated."""

from __future__ import annotations

import sqlite3

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import Scenario, Variant, add_email, days_ago, login_cell
from tasks.apptown.scenarios.lookup_single import (
    check_latest_flagged,
    friend_senders,
    latest_from_cells,
)
from tasks.apptown.world import World

LOOKUP_WARM_BANDS: tuple[tuple[str, int], ...] = (("lookup_warm", 6),)


class PaymentsCountFeed(Scenario):
    id = "payments_count_feed"
    difficulty = 1
    apps = ("payments",)
    split = "lookup_warm"
    more_variants = LOOKUP_WARM_BANDS
    mistake = "counts only the first page of the social feed"

    # The public transactions with one of a person's payments friends: their social feed.
    FEED = (
        "SELECT count(*) AS n FROM payments_transactions t WHERE t.is_private = 0 AND "
        "(t.sender_id IN (SELECT friend_id FROM payments_friends WHERE person_id = {who}) OR "
        "t.receiver_id IN (SELECT friend_id FROM payments_friends WHERE person_id = {who}))"
    )

    def variants(self, world: World) -> list[Variant]:
        people = world.template.rows(
            f"SELECT p.id, ({self.FEED.format(who='p.id')}) AS n FROM people p"
        )
        users = self.pick_users(world, [r["id"] for r in people if r["n"] > 5])
        wordings = (
            "How many transactions are in my payments social feed?",
            "Count the transactions on my social feed in payments and tell me the number.",
            "What is the number of transactions my payments social feed shows?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            "feed = all_pages(apis.payments.show_social_feed)\nprint(len(feed))",
            "apis.supervisor.complete_task(answer=len(feed))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            "feed = apis.payments.show_social_feed()\n"
            "apis.supervisor.complete_task(answer=len(feed))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        g.check_answer(g.before(self.FEED.format(who="?"), (v.user_id, v.user_id))[0]["n"])
        g.check_no_other_changes()


class MusicCountLibrarySongs(Scenario):
    id = "music_count_library_songs"
    difficulty = 1
    apps = ("music",)
    split = "lookup_warm"
    more_variants = LOOKUP_WARM_BANDS
    mistake = "counts only the first page of the library"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT person_id FROM music_library GROUP BY person_id HAVING count(*) > 5"
        )
        users = self.pick_users(world, [r["person_id"] for r in rows])
        wordings = (
            "How many songs are in my music library?",
            "Count the songs in my library on music and tell me the number.",
            "What is the number of songs in my music app's library?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "library = all_pages(apis.music.show_library)\nprint(len(library))",
            "apis.supervisor.complete_task(answer=len(library))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "library = apis.music.show_library()\n"
            "apis.supervisor.complete_task(answer=len(library))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before("SELECT count(*) AS n FROM music_library WHERE person_id = ?", (v.user_id,))
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class EmailCountSentEmails(Scenario):
    id = "email_count_sent_emails"
    difficulty = 1
    apps = ("email",)
    split = "lookup_warm"
    more_variants = LOOKUP_WARM_BANDS
    mistake = "counts only the first page of sent emails"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT sender_id FROM email_emails GROUP BY sender_id HAVING count(*) > 5"
        )
        users = self.pick_users(world, [r["sender_id"] for r in rows])
        wordings = (
            "How many emails have I sent?",
            "Count the emails I sent and tell me the number.",
            "What is the number of sent emails in my email account?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("email"),
            "sent = all_pages(apis.email.show_sent_emails)\nprint(len(sent))",
            "apis.supervisor.complete_task(answer=len(sent))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("email"),
            "sent = apis.email.show_sent_emails()\napis.supervisor.complete_task(answer=len(sent))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before("SELECT count(*) AS n FROM email_emails WHERE sender_id = ?", (v.user_id,))
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class EmailArchiveLatestFrom(Scenario):
    id = "email_archive_latest_from"
    difficulty = 1
    apps = ("email",)
    split = "lookup_warm"
    more_variants = LOOKUP_WARM_BANDS
    mistake = "archives the sender's oldest email instead of the latest"

    # The emails the setup delivers from the sender, newest first: (days ago, subject).
    EMAILS = ((2.5, "Dinner plans"), (6, "The receipt"), (13, "Last month"))

    def variants(self, world: World) -> list[Variant]:
        wordings = (
            "Archive the most recent email {name} sent me.",
            "Please archive the latest email I got from {name}.",
            "Find the newest email from {name} in my inbox and archive it.",
        )
        users, params = friend_senders(self, world)
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        for days, subject in self.EMAILS:
            add_email(db, v["sender_id"], v.user_id, subject, "Talk soon!", days_ago(world, days))

    def gold(self, v: Variant) -> list[str]:
        return latest_from_cells(v, "archive_email", 0)

    def wrong(self, v: Variant) -> list[str]:
        return latest_from_cells(v, "archive_email", -1)

    def evaluate(self, g: Grader, v: Variant) -> None:
        check_latest_flagged(g, v, "is_archived", "archived")


LOOKUP_WARM: tuple[Scenario, ...] = (
    PaymentsCountFeed(),
    MusicCountLibrarySongs(),
    EmailCountSentEmails(),
    EmailArchiveLatestFrom(),
)
