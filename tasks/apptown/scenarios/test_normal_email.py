"""Test-normal split, continued: scenarios that end in sending an email."""

from __future__ import annotations

import sqlite3
from typing import Any

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
from tasks.apptown.world import World, insert_row


def sent_email(g: Grader, user_id: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The emails the user sent during the rollout, and their recipient rows."""
    sent = [e for e in g.diff.added("email_emails") if e["sender_id"] == user_id]
    recipients = [r for r in g.diff.added("email_recipients") if r["email_id"] in ids(sent)]
    return sent, recipients


class EmailCoworkersAnnouncement(Scenario):
    id = "email_coworkers_announcement"
    difficulty = 2
    apps = ("phone", "email")
    split = "test_normal"
    mistake = "emails only the first page of coworkers"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world,
            [
                p.id
                for p in world.society.people
                if len(world.society.related(p.id, "coworker")) > 5
            ],
        )
        params = [
            {"subject": s, "body": b}
            for s, b in (
                ("Office move", "We move to the new office on Monday."),
                ("Cake in the kitchen", "There is cake in the kitchen, help yourselves!"),
                ("Out next week", "I am out next week; ping me by text if urgent."),
            )
        ]
        wordings = (
            "Send one email to all my coworkers with subject '{subject}' and body '{body}'.",
            "Email every coworker of mine (a single email to all of them): subject "
            "'{subject}', text '{body}'.",
            "Let all my coworkers know by email, in one message. Subject: '{subject}'. "
            "Body: '{body}'.",
        )
        return self.make_variants(users, wordings, params)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "email"),
            'coworkers = all_pages(apis.phone.search_contacts, relationship="coworker")\n'
            'emails = [c["email"] for c in coworkers]\nprint(len(emails))',
            f'apis.email.send_email(recipients=emails, subject="{v["subject"]}", '
            f'body="{v["body"]}")',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(
            "all_pages(apis.phone.search_contacts, ", "apis.phone.search_contacts("
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        emails = {c["email"] for c in contacts_with(g, v.user_id, "coworker")}
        people = {pid for email, pid in person_ids(g).items() if email in emails}
        sent, recipients = sent_email(g, v.user_id)
        got = {r["person_id"] for r in recipients}
        g.check(
            "one_email_to_coworkers",
            "One email went to exactly the user's coworkers",
            len(sent) == 1 and got == people,
            f"{len(sent)} email(s) to {len(got)} people; coworkers: {len(people)}",
        )
        g.check(
            "subject_and_body",
            f"Its subject is {v['subject']!r} and body {v['body']!r}",
            [(e["subject"], e["body"]) for e in sent] == [(v["subject"], v["body"])],
            f"sent {[(e['subject'], e['body']) for e in sent]}",
        )
        g.check_no_other_changes(
            {"email_emails": ids(sent[:1]), "email_recipients": ids(recipients)}
        )


class MusicEmailPlaylistToPartner(Scenario):
    id = "music_email_playlist_to_partner"
    difficulty = 3
    apps = ("phone", "music", "email")
    split = "test_normal"
    mistake = "lists the songs alphabetically instead of in playlist order"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world, [p.id for p in world.society.people if world.society.related(p.id, "partner")]
        )
        params = [{"title": t} for t in ("Rainy Days", "Kitchen Dance", "Late Drive")]
        wordings = (
            "Email my partner the songs of my playlist '{title}': subject '{title} "
            "songs', and in the body one song title per line, in playlist order.",
            "Send my partner an email with subject '{title} songs' listing the titles "
            "of the songs in my '{title}' playlist, one per line, in the playlist's "
            "order.",
            "My partner wants to know what is on my playlist '{title}'. Email them the "
            "song titles (one per line, same order as the playlist) with the subject "
            "'{title} songs'.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        rng = self.rng(world)
        songs = db.execute("SELECT id, title FROM music_songs ORDER BY id").fetchall()
        chosen = rng.sample(list(songs), 6)
        while [s["title"] for s in chosen] == sorted(s["title"] for s in chosen):
            rng.shuffle(chosen)
        pl = insert_row(
            db,
            "music_playlists",
            owner_id=v.user_id,
            title=v["title"],
            is_public=0,
            created_at=days_ago(world, 2),
        )
        for pos, song in enumerate(chosen):
            insert_row(db, "music_playlist_songs", playlist_id=pl, song_id=song["id"], position=pos)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "music", "email"),
            'partner = all_pages(apis.phone.search_contacts, relationship="partner")[0]\n'
            "playlists = all_pages(apis.music.show_playlists)\n"
            f'playlist = next(p for p in playlists if p["title"] == "{v["title"]}")\n'
            'songs = apis.music.show_playlist(playlist_id=playlist["playlist_id"])["songs"]\n'
            'titles = [s["title"] for s in songs]\nprint(titles)',
            f'apis.email.send_email(recipients=[partner["email"]], subject="{v["title"]} '
            'songs", body="\\n".join(titles))',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = cells[2].replace('"\\n".join(titles)', '"\\n".join(sorted(titles))')
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        partner = contacts_with(g, v.user_id, "partner")[0]
        partner_id = person_ids(g)[partner["email"]]
        titles = [
            r["title"]
            for r in g.before(
                "SELECT s.title FROM music_playlist_songs x JOIN music_playlists p ON p.id = "
                "x.playlist_id JOIN music_songs s ON s.id = x.song_id WHERE p.owner_id = ? AND "
                "p.title = ? ORDER BY x.position, x.id",
                (v.user_id, v["title"]),
            )
        ]
        sent, recipients = sent_email(g, v.user_id)
        g.check(
            "emailed_partner",
            f"One email with subject '{v['title']} songs' went to the partner only",
            [e["subject"] for e in sent] == [f"{v['title']} songs"]
            and [r["person_id"] for r in recipients] == [partner_id],
            f"sent {[e['subject'] for e in sent]} to {[r['person_id'] for r in recipients]}",
        )
        lines = [line.strip() for e in sent for line in e["body"].splitlines() if line.strip()]
        g.check(
            "song_list",
            "The body lists the playlist's titles, one per line, in order",
            lines == titles,
            f"body lines {lines}, expected {titles}",
        )
        g.check_no_other_changes(
            {"email_emails": ids(sent[:1]), "email_recipients": ids(recipients)}
        )


TEST_NORMAL_EMAIL: tuple[Scenario, ...] = (
    EmailCoworkersAnnouncement(),
    MusicEmailPlaylistToPartner(),
)
