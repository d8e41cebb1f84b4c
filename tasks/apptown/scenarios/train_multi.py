"""Train split, difficulty 2-3: chains across phone, payments, music and email where the agent
must look people up instead of assuming who they are (LOOP paper, Figures 3 and 6)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    LOOKUP_BANDS,
    Scenario,
    Variant,
    columns,
    contacts_with,
    days_ago,
    ids,
    login_cell,
    people_with,
    person_ids,
)
from tasks.apptown.world import World, insert_row

_ROOMMATES = (
    'roommates = all_pages(apis.phone.search_contacts, relationship="roommate")\n'
    'emails = {c["email"] for c in roommates}\nprint(emails)'
)


def _with_roommates(world: World, at_least: int = 1) -> list[int]:
    return [
        p.id
        for p in world.society.people
        if len(world.society.related(p.id, "roommate")) >= at_least
    ]


def _emails_of(g: Grader, contacts: list[dict]) -> set[str]:
    return {c["email"] for c in contacts}


def _person_ids(g: Grader, emails: set[str]) -> set[int]:
    return {pid for email, pid in person_ids(g).items() if email in emails}


class PaymentsRemindRoommates(Scenario):
    id = "payments_remind_roommates"
    difficulty = 2
    apps = ("phone", "payments")
    split = "train"
    more_variants = LOOKUP_BANDS
    mistake = "takes payment friends for roommates"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, _with_roommates(world))
        wordings = (
            "Remind my roommates about the payment requests I sent them that are still pending.",
            "Some of my roommates still haven't paid the payment requests I sent. Send "
            "a reminder for each pending one.",
            "Send reminders for all my pending payment requests to my roommates.",
            # the `more_variants` bands cycle through five wordings (variants 1-3 keep theirs)
            "Nudge each roommate of mine who still owes me on a pending payment request.",
            "My roommates have payment requests from me they have not settled yet: remind "
            "them of every one.",
        )
        return self.make_variants(users, wordings, [{} for _ in users])

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        rng = self.rng(world)
        roommates = [p.id for p in people_with(world, v.user_id, "roommate")]
        friends = [
            r["friend_id"]
            for r in db.execute(
                "SELECT friend_id FROM payments_friends WHERE person_id = ?", (v.user_id,)
            )
        ]
        others = [f for f in friends if f not in roommates][:2]
        assert others, f"{self.id}: user {v.user_id} has no payment friend who is no roommate"
        for payer, status in [(r, "pending") for r in roommates + others + others] + [
            (roommates[0], "approved")
        ]:
            insert_row(
                db,
                "payments_requests",
                requester_id=v.user_id,
                payer_id=payer,
                amount=round(rng.uniform(8, 60), 2),
                description="shared groceries",
                created_at=days_ago(world, rng.uniform(1, 20)),
                status=status,
                reminded_at=None,
                resolved_at=None,
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "payments"),
            _ROOMMATES,
            'pending = all_pages(apis.payments.show_sent_payment_requests, status="pending")\n'
            "for r in pending:\n"
            '    if r["payer_email"] in emails:\n'
            "        apis.payments.remind_payment_request(\n"
            '            payment_request_id=r["payment_request_id"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = (
            "friends = all_pages(apis.payments.show_friends)\n"
            'emails = {f["email"] for f in friends}'
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        payers = _person_ids(g, _emails_of(g, contacts_with(g, v.user_id, "roommate")))
        due = [
            r
            for r in g.before(
                "SELECT * FROM payments_requests WHERE requester_id = ? AND status = 'pending'",
                (v.user_id,),
            )
            if r["payer_id"] in payers
        ]
        after = {r["id"]: r for r in g.after("SELECT * FROM payments_requests")}
        missed = [r["id"] for r in due if after[r["id"]]["reminded_at"] is None]
        g.check(
            "roommates_reminded",
            "Every pending payment request the user sent to a roommate was reminded",
            not missed,
            f"requests not reminded: {missed}",
        )
        g.check_no_other_changes({"payments_requests": columns(due, "reminded_at")})


class PaymentsLikeRoommateTransactions(Scenario):
    id = "payments_like_roommate_transactions"
    difficulty = 2
    apps = ("phone", "payments")
    split = "train"
    more_variants = LOOKUP_BANDS
    mistake = "ignores the date and likes older transactions too"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, _with_roommates(world))
        since = [(world.now.date().replace(day=1)).isoformat()] * 3
        more = self.rng(world, "more-values")
        for _ in users[3:]:  # the `more_variants`: a cut-off 5-30 days back, so that the setup's
            # transactions 3 days old are always in and those 40 days old always out
            since.append((world.now.date() - timedelta(days=more.randint(5, 30))).isoformat())
        wordings = (
            "Like every payments transaction between me and my roommates made on or after {since}.",
            "Go through the payments I exchanged with my roommates since {since} "
            "(inclusive) and like each one I haven't liked yet.",
            "Please like all transactions from {since} onwards that are between me and "
            "any of my roommates.",
            "Like each payments transaction between me and any roommate dated {since} or later.",
        )
        return self.make_variants(users, wordings, [{"since": s} for s in since])

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        rng = self.rng(world)
        me = v.user_id
        for i, rm in enumerate(p.id for p in people_with(world, me, "roommate")):
            for sender, receiver, days in ((me, rm, 3 + i), (rm, me, 9 + i), (rm, me, 40 + i)):
                tid = insert_row(
                    db,
                    "payments_transactions",
                    sender_id=sender,
                    receiver_id=receiver,
                    amount=round(rng.uniform(5, 80), 2),
                    description="utilities",
                    created_at=days_ago(world, days),
                    is_private=0,
                )
            if i == 0:  # the oldest in-window one is already liked: liking it again is an error
                insert_row(
                    db,
                    "payments_likes",
                    transaction_id=tid - 1,
                    person_id=me,
                    created_at=days_ago(world, 1),
                )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "payments"),
            _ROOMMATES,
            "for email in emails:\n"
            "    for t in all_pages(apis.payments.show_transactions, user_email=email):\n"
            f'        if t["created_at"] >= "{v["since"]}" and not t["liked_by_me"]:\n'
            '            apis.payments.like_transaction(transaction_id=t["transaction_id"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = cells[2].replace(f't["created_at"] >= "{v["since"]}" and ', "")
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        others = _person_ids(g, _emails_of(g, contacts_with(g, v.user_id, "roommate")))
        rows = g.before(
            "SELECT * FROM payments_transactions WHERE (sender_id = ?1 OR "
            "receiver_id = ?1) AND created_at >= ?2",
            (v.user_id, v["since"]),
        )
        due = {r["id"] for r in rows if {r["sender_id"], r["receiver_id"]} & others}
        liked = {
            r["transaction_id"]
            for r in g.after(
                "SELECT transaction_id FROM payments_likes WHERE person_id = ?", (v.user_id,)
            )
        }
        g.check(
            "transactions_liked",
            f"Every transaction between the user and a roommate since {v['since']} is liked",
            due <= liked,
            f"not liked: {sorted(due - liked)}",
        )
        new = [r for r in g.diff.added("payments_likes") if r["transaction_id"] in due]
        g.check_no_other_changes({"payments_likes": ids(new)})


class MusicPlaylistFromLikedArtist(Scenario):
    id = "music_playlist_from_liked_artist"
    difficulty = 2
    apps = ("music",)
    split = "train"
    more_variants = LOOKUP_BANDS
    mistake = "adds every song by the artist, not only the liked ones"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        rng = self.rng(world)
        every = sorted({r["artist"] for r in world.template.rows("SELECT artist FROM music_songs")})
        artists = rng.sample(every, 3)
        more = self.rng(world, "more-values")  # the `more_variants`' artists, any of them
        artists += [more.choice(every) for _ in users[3:]]
        titles = ("Best of {a}", "{a} favourites", "My {a} picks", "{a} on repeat", "Liked {a}")
        params = [
            {"artist": a, "title": titles[i % len(titles)].format(a=a)}
            for i, a in enumerate(artists)
        ]
        wordings = (
            "Create a playlist called '{title}' with all the songs by {artist} that I have liked.",
            "Make me a new music playlist named '{title}' containing every song I liked "
            "from {artist}.",
            "I want a playlist '{title}': put in it each of my liked songs by {artist}.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        songs = [
            r["id"]
            for r in db.execute(
                "SELECT id FROM music_songs WHERE artist = ? AND id NOT IN (SELECT song_id FROM "
                "music_likes WHERE person_id = ?) ORDER BY id",
                (v["artist"], v.user_id),
            )
        ]
        for sid in songs[:3]:
            insert_row(
                db, "music_likes", person_id=v.user_id, song_id=sid, created_at=days_ago(world, 30)
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "liked = all_pages(apis.music.show_liked_songs)\n"
            f'song_ids = [s["song_id"] for s in liked if s["artist"] == "{v["artist"]}"]\n'
            "print(song_ids)",
            f'playlist = apis.music.create_playlist(title="{v["title"]}")\n'
            "for song_id in song_ids:\n"
            '    apis.music.add_song_to_playlist(playlist_id=playlist["id"], song_id=song_id)',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = (
            f'songs = all_pages(apis.music.search_songs, artist="{v["artist"]}")\n'
            'song_ids = [s["song_id"] for s in songs]'
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        expected = {
            r["id"]
            for r in g.before(
                "SELECT s.id FROM music_songs s JOIN music_likes l ON l.song_id = s.id WHERE "
                "l.person_id = ? AND s.artist = ?",
                (v.user_id, v["artist"]),
            )
        }
        new = [p for p in g.diff.added("music_playlists") if p["owner_id"] == v.user_id]
        g.check(
            "playlist_created",
            f"Exactly one playlist titled {v['title']!r} was created",
            [p["title"] for p in new] == [v["title"]],
            f"new playlists: {[p['title'] for p in new]}",
        )
        songs = g.after(
            "SELECT * FROM music_playlist_songs WHERE playlist_id = ?",
            (new[0]["id"] if new else -1,),
        )
        got = {s["song_id"] for s in songs}
        g.check(
            "playlist_songs",
            f"It holds exactly the liked songs by {v['artist']}",
            got == expected and len(songs) == len(expected),
            f"song ids {sorted(got)}, expected {sorted(expected)}",
        )
        g.check_no_other_changes(
            {"music_playlists": ids(new[:1]), "music_playlist_songs": ids(songs)}
        )


TRAIN_MULTI_APP: tuple[Scenario, ...] = (
    PaymentsRemindRoommates(),
    PaymentsLikeRoommateTransactions(),
    MusicPlaylistFromLikedArtist(),
)
