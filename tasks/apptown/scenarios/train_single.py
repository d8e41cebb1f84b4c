"""Train split, difficulty 1: one app, a handful of calls. The easy band a small model can
sometimes solve, each still with one trap (pagination, a confusable API, a missing field)."""

from __future__ import annotations

import sqlite3

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import Scenario, Variant, add_email, days_ago, ids, login_cell
from tasks.apptown.world import World

# The easy band: beyond its 3 train variants, each scenario here has 6 held-out variants (split
# `easy_heldout`, never trained on) and 12 more for training (split `easy`). Held-out first, so
# resizing the training band never changes a held-out task.
EASY_BANDS: tuple[tuple[str, int], ...] = (("easy_heldout", 6), ("easy", 12))


# New contacts for the `more_variants` of phone_add_contact (none of them is in the world).
NEW_FIRST = ("Aino", "Bruno", "Oona", "Dmitri", "Pavel", "Farid", "Rania", "Jonas", "Keiko", "Luca")
NEW_LAST = ("Varga", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Quispe", "Novak", "Brandt")
NEW_RELS = ("coworker", "friend", "roommate")


class PaymentsBalance(Scenario):
    id = "payments_balance"
    difficulty = 1
    apps = ("payments",)
    split = "train"
    more_variants = EASY_BANDS
    mistake = "answers with a recent transaction amount instead of reading the balance"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        wordings = (
            "How much money do I have in my payments account right now?",
            "What is my current balance in the payments app?",
            "Check my payments balance and tell me the amount.",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            'balance = apis.payments.show_balance()["balance"]\nprint(balance)',
            "apis.supervisor.complete_task(answer=balance)",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("payments"),
            'latest = apis.payments.show_transactions(direction="received")\n'
            'apis.supervisor.complete_task(answer=latest[0]["amount"])',
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before("SELECT balance FROM payments_accounts WHERE person_id = ?", (v.user_id,))
        g.check_answer(rows[0]["balance"])
        g.check_no_other_changes()


class MusicCountPlaylists(Scenario):
    id = "music_count_playlists"
    difficulty = 1
    apps = ("music",)
    split = "train"
    more_variants = EASY_BANDS
    mistake = "counts only the first page of playlists"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT owner_id FROM music_playlists GROUP BY owner_id HAVING count(*) >= 6"
        )
        users = self.pick_users(world, [r["owner_id"] for r in rows])
        wordings = (
            "How many playlists do I have in my music app?",
            "Count my music playlists and tell me the number.",
            "What is the total number of playlists in my music account?",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "playlists = all_pages(apis.music.show_playlists)\nprint(len(playlists))",
            "apis.supervisor.complete_task(answer=len(playlists))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "playlists = apis.music.show_playlists()\n"
            "apis.supervisor.complete_task(answer=len(playlists))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before(
            "SELECT count(*) AS n FROM music_playlists WHERE owner_id = ?", (v.user_id,)
        )
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class PhoneAddContact(Scenario):
    id = "phone_add_contact"
    difficulty = 1
    apps = ("phone",)
    split = "train"
    more_variants = EASY_BANDS
    mistake = "adds the contact without the relationship"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        rngs = self.variant_rngs(world)
        newcomers = [
            ("Greta", "Holm", "coworker"),
            ("Tomas", "Reyes", "friend"),
            ("Lina", "Park", "roommate"),
        ]
        more = rngs[-1]
        while len(newcomers) < len(users):
            newcomer = (more.choice(NEW_FIRST), more.choice(NEW_LAST), more.choice(NEW_RELS))
            if newcomer[:2] not in [n[:2] for n in newcomers]:
                newcomers.append(newcomer)
        params = [
            {
                "first": f,
                "last": last,
                "rel": rel,
                "email": f"{f.lower()}@holmpark.io",
                "phone": f"{rng.randint(201, 989)}555{rng.randint(1000, 9999)}",
            }
            for (f, last, rel), rng in zip(newcomers, rngs, strict=True)
        ]
        wordings = (
            "Add {first} {last} to my phone contacts as a {rel}: phone number {phone}, "
            "email {email}.",
            "Save my new {rel} {first} {last} in my phone: number {phone}, email address "
            "{email}. Mark the relationship too.",
            "Please create a phone contact for {first} {last} ({phone}, {email}) and tag them "
            "as my {rel}.",
        )
        return self.make_variants(users, wordings, params)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone"),
            f'apis.phone.add_contact(first_name="{v["first"]}", last_name="{v["last"]}", '
            f'phone_number="{v["phone"]}", email="{v["email"]}", '
            f'relationships=["{v["rel"]}"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("phone"),
            f'apis.phone.add_contact(first_name="{v["first"]}", last_name="{v["last"]}", '
            f'phone_number="{v["phone"]}", email="{v["email"]}")',
            "apis.supervisor.complete_task()",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        new = [
            r
            for r in g.diff.added("phone_contacts")
            if r["owner_id"] == v.user_id
            and (r["first_name"], r["last_name"]) == (v["first"], v["last"])
        ]
        found = [r for r in new if r["phone_number"] == v["phone"] and r["email"] == v["email"]]
        g.check(
            "contact_added",
            f"Exactly one contact {v['first']} {v['last']} with number {v['phone']} and "
            f"email {v['email']} was added",
            len(found) == 1 and len(new) == 1,
            f"matching new contacts: {new}",
        )
        rels = [r["relationships"] for r in found]
        g.check(
            "relationship_set",
            f"The new contact's relationships are [{v['rel']!r}]",
            rels == [f'["{v["rel"]}"]'],
            f"relationships of the new contact: {rels}",
        )
        g.check_no_other_changes({"phone_contacts": ids(found[:1])})


class MusicLikeSong(Scenario):
    id = "music_like_song"
    difficulty = 1
    apps = ("music",)
    split = "train"
    more_variants = EASY_BANDS
    mistake = "adds the song to the library instead of liking it"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        params = []
        for user, rng in zip(users, self.variant_rngs(world), strict=True):
            songs = world.template.rows(
                "SELECT id, title, artist FROM music_songs WHERE id NOT IN (SELECT song_id FROM "
                "music_likes WHERE person_id = ?1) AND id NOT IN (SELECT song_id FROM "
                "music_library WHERE person_id = ?1) ORDER BY id",
                (user,),
            )
            song = rng.choice(songs)
            params.append({"song_id": song["id"], "title": song["title"], "artist": song["artist"]})
        wordings = (
            "Like the song '{title}' by {artist} in my music app.",
            "I really enjoy '{title}' by {artist}; please like it on music.",
            "Add a like to the song '{title}' ({artist}) in the music app.",
        )
        return self.make_variants(users, wordings, params)

    def _find(self, v: Variant) -> str:
        return (
            f'songs = apis.music.search_songs(query="{v["title"]}", page_limit=20)\n'
            f'song = next(s for s in songs if s["title"] == "{v["title"]}" '
            f'and s["artist"] == "{v["artist"]}")\nprint(song)'
        )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            self._find(v),
            'apis.music.like_song(song_id=song["song_id"])\napis.supervisor.complete_task()',
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            self._find(v),
            'apis.music.add_song_to_library(song_id=song["song_id"])\n'
            "apis.supervisor.complete_task()",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        likes = [r for r in g.diff.added("music_likes") if r["person_id"] == v.user_id]
        liked = [r["song_id"] for r in likes]
        g.check(
            "song_liked",
            f"Song {v['song_id']} ({v['title']}) and only it was liked",
            liked == [v["song_id"]],
            f"newly liked song ids: {liked}",
        )
        g.check_no_other_changes({"music_likes": ids(likes[:1])})


class EmailCountFromSender(Scenario):
    id = "email_count_from_sender"
    difficulty = 1
    apps = ("email",)
    split = "train"
    more_variants = EASY_BANDS
    mistake = "forgets the archived emails"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        params = []
        for user, rng in zip(users, self.variant_rngs(world), strict=True):
            sender = world.person(rng.choice(world.society.related(user, "friend")))
            params.append({"sender_id": sender.id, "name": sender.name, "count": rng.randint(3, 5)})
        wordings = (
            "How many emails have I received from {name}, counting archived ones too?",
            "Count every email {name} has sent me, including the archived ones.",
            "What is the number of emails in my mailbox from {name}, archived included?",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        for i in range(v["count"]):
            add_email(
                db,
                v["sender_id"],
                v.user_id,
                f"Catching up, part {i + 1}",
                "Long time no see!",
                days_ago(world, 3 + 4 * i),
                archived=i % 2 == 0,
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("email"),
            "emails = all_pages(apis.email.show_inbox, include_archived=True)\n"
            f'count = len([e for e in emails if e["sender_name"] == "{v["name"]}"])\n'
            "print(count)",
            "apis.supervisor.complete_task(answer=count)",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("email"),
            "emails = all_pages(apis.email.show_inbox)\n"
            f'count = len([e for e in emails if e["sender_name"] == "{v["name"]}"])\n'
            "apis.supervisor.complete_task(answer=count)",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before(
            "SELECT count(*) AS n FROM email_emails e JOIN email_recipients r ON "
            "r.email_id = e.id WHERE e.sender_id = ? AND r.person_id = ?",
            (v["sender_id"], v.user_id),
        )
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class PhoneCountRelationship(Scenario):
    id = "phone_count_relationship"
    difficulty = 1
    apps = ("phone",)
    split = "train"
    more_variants = EASY_BANDS
    mistake = "counts only the first page of contacts"

    def variants(self, world: World) -> list[Variant]:
        related = world.society.related
        users = self.pick_users(
            world,
            [
                p.id
                for p in world.society.people
                if len(related(p.id, "coworker")) > 5 and len(related(p.id, "friend")) > 5
            ],
        )
        labels = [("coworker", "friend")[n % 2 == 0] for n in range(1, len(users) + 1)]
        wordings = (
            "How many of my phone contacts are tagged as my {label}s?",
            "Count the contacts in my phone whose relationship to me is {label}.",
            "How many {label}s do I have in my phone contacts?",
        )
        return self.make_variants(users, wordings, [{"label": label} for label in labels])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone"),
            f'people = all_pages(apis.phone.search_contacts, relationship="{v["label"]}")\n'
            "print(len(people))",
            "apis.supervisor.complete_task(answer=len(people))",
        ]

    def wrong(self, v: Variant) -> list[str]:
        return [
            login_cell("phone"),
            f'people = apis.phone.search_contacts(relationship="{v["label"]}")\n'
            "apis.supervisor.complete_task(answer=len(people))",
        ]

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before(
            "SELECT count(*) AS n FROM phone_contacts WHERE owner_id = ? AND EXISTS "
            "(SELECT 1 FROM json_each(relationships) WHERE value = ?)",
            (v.user_id, v["label"]),
        )
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


TRAIN_SINGLE_APP: tuple[Scenario, ...] = (
    PaymentsBalance(),
    MusicCountPlaylists(),
    PhoneAddContact(),
    MusicLikeSong(),
    EmailCountFromSender(),
    PhoneCountRelationship(),
)
