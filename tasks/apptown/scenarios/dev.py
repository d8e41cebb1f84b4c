"""Dev split: held-out scenarios for model selection (dev_files.py holds the ones using `files`)."""

from __future__ import annotations

import sqlite3

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    Scenario,
    Variant,
    contacts_with,
    days_ago,
    ids,
    login_cell,
    people_with,
)
from tasks.apptown.world import World, insert_row


class MusicCountLibraryGenre(Scenario):
    id = "music_count_library_genre"
    difficulty = 1
    apps = ("music",)
    split = "dev"
    mistake = "counts only the first page of the library"

    def variants(self, world: World) -> list[Variant]:
        pairs = []
        for p in world.society.people:
            genres = [s["genre"] for s in world.library_songs(p.id)]
            pairs += [
                (p.id, g)
                for g in sorted(set(genres))
                if genres.count(g) >= 2 and genres.count(g) != genres[:5].count(g)
            ]
        chosen = self.rng(world).sample(pairs, 3)
        wordings = (
            "How many {genre} songs are in my music library?",
            "Count the songs of the genre '{genre}' in my music library.",
            "In my music library, how many songs are {genre}?",
        )
        return self.make_variants(
            [u for u, _ in chosen], wordings, [{"genre": g} for _, g in chosen]
        )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "library = all_pages(apis.music.show_library)\n"
            f'count = len([s for s in library if s["genre"] == "{v["genre"]}"])\nprint(count)',
            "apis.supervisor.complete_task(answer=count)",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(
            "all_pages(apis.music.show_library)", "apis.music.show_library()"
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        rows = g.before(
            "SELECT count(*) AS n FROM music_library l JOIN music_songs s ON s.id = "
            "l.song_id WHERE l.person_id = ? AND s.genre = ?",
            (v.user_id, v["genre"]),
        )
        g.check_answer(rows[0]["n"])
        g.check_no_other_changes()


class PaymentsTotalFromPartner(Scenario):
    id = "payments_total_from_partner"
    difficulty = 2
    apps = ("phone", "payments")
    split = "dev"
    mistake = "sums only the first page of transactions"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(
            world, [p.id for p in world.society.people if world.society.related(p.id, "partner")]
        )
        wordings = (
            "How much money have I received in total from my partner through payments?",
            "Add up every payment my partner has sent me on payments. What is the total?",
            "What is the total amount my partner has paid me in the payments app?",
        )
        return self.make_variants(users, wordings, [{}, {}, {}])

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        rng = self.rng(world)
        partner = people_with(world, v.user_id, "partner")[0].id
        for i in range(6):
            insert_row(
                db,
                "payments_transactions",
                sender_id=partner,
                receiver_id=v.user_id,
                amount=round(rng.uniform(5, 90), 2),
                description="dinner",
                created_at=days_ago(world, 2 + 5 * i),
                is_private=int(i % 3 == 0),
            )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone", "payments"),
            'partner = all_pages(apis.phone.search_contacts, relationship="partner")[0]\n'
            'received = all_pages(apis.payments.show_transactions, direction="received", '
            'user_email=partner["email"])\n'
            'total = round(sum(t["amount"] for t in received), 2)\nprint(total)',
            "apis.supervisor.complete_task(answer=total)",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(
            "all_pages(apis.payments.show_transactions, ", "apis.payments.show_transactions("
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        partner = contacts_with(g, v.user_id, "partner")[0]
        rows = g.before(
            "SELECT round(sum(t.amount), 2) AS total FROM payments_transactions t "
            "JOIN people p ON p.id = t.sender_id WHERE p.email = ? AND "
            "t.receiver_id = ?",
            (partner["email"], v.user_id),
        )
        g.check_answer(rows[0]["total"])
        g.check_no_other_changes()


class PhoneTextSiblings(Scenario):
    id = "phone_text_siblings"
    difficulty = 2
    apps = ("phone",)
    split = "dev"
    mistake = "assumes everyone with the user's last name is a sibling"

    def variants(self, world: World) -> list[Variant]:
        related = world.society.related
        users = self.pick_users(
            world,
            [
                p.id
                for p in world.society.people
                if related(p.id, "sibling") and related(p.id, "parent")
            ],
        )
        msgs = (
            "Family dinner at my place on Sunday!",
            "Happy holidays, love you all!",
            "Can someone call mom this weekend?",
        )
        wordings = (
            "Text all my siblings: '{msg}'",
            "Send each of my siblings the text '{msg}'",
            "Message my brothers and sisters on the phone app with: '{msg}'",
        )
        return self.make_variants(users, wordings, [{"msg": m} for m in msgs])

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("phone"),
            'siblings = all_pages(apis.phone.search_contacts, relationship="sibling")\n'
            "for s in siblings:\n"
            f'    apis.phone.send_text_message(phone_number=s["phone_number"], body="{v["msg"]}")',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace('relationship="sibling"', 'query=profile["last_name"]')
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        numbers = sorted(c["phone_number"] for c in contacts_with(g, v.user_id, "sibling"))
        phone_of = {r["id"]: r["phone_number"] for r in g.before("SELECT * FROM people")}
        sent = [m for m in g.diff.added("phone_messages") if m["sender_id"] == v.user_id]
        got = sorted(phone_of[m["receiver_id"]] for m in sent if m["body"] == v["msg"])
        g.check(
            "siblings_texted",
            f"Each sibling got the text {v['msg']!r} once, nobody else",
            got == numbers and len(sent) == len(numbers),
            f"texted {sorted(phone_of[m['receiver_id']] for m in sent)}, siblings {numbers}",
        )
        g.check_no_other_changes({"phone_messages": ids(sent)})


class MusicPlaylistRemoveArtist(Scenario):
    id = "music_playlist_remove_artist"
    difficulty = 2
    apps = ("music",)
    split = "dev"
    mistake = "looks for the playlist on the first page only"

    def variants(self, world: World) -> list[Variant]:
        rows = world.template.rows(
            "SELECT owner_id FROM music_playlists GROUP BY owner_id HAVING count(*) >= 5"
        )
        users = self.pick_users(world, [r["owner_id"] for r in rows])
        artists = self.rng(world).sample(
            sorted({r["artist"] for r in world.template.rows("SELECT artist FROM music_songs")}), 3
        )
        params = [
            {"artist": a, "title": t}
            for a, t in zip(artists, ("Road Trip", "Sunday Morning", "Workout"), strict=True)
        ]
        wordings = (
            "Remove every song by {artist} from my playlist '{title}'.",
            "My playlist '{title}' has too much {artist}: take all of their songs out.",
            "Delete all {artist} songs from the '{title}' playlist (keep the others).",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        rng = self.rng(world)
        by_artist = [
            r["id"]
            for r in db.execute("SELECT id FROM music_songs WHERE artist = ?", (v["artist"],))
        ]
        others = [
            r["id"]
            for r in db.execute("SELECT id FROM music_songs WHERE artist != ?", (v["artist"],))
        ]
        songs = rng.sample(by_artist, 3) + rng.sample(others, 6)
        rng.shuffle(songs)
        pl = insert_row(
            db,
            "music_playlists",
            owner_id=v.user_id,
            title=v["title"],
            is_public=0,
            created_at=days_ago(world, 1),
        )
        for pos, sid in enumerate(songs):
            insert_row(db, "music_playlist_songs", playlist_id=pl, song_id=sid, position=pos)

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("music"),
            "playlists = all_pages(apis.music.show_playlists)\n"
            f'playlist = next(p for p in playlists if p["title"] == "{v["title"]}")\n'
            'songs = apis.music.show_playlist(playlist_id=playlist["playlist_id"])["songs"]',
            "for s in songs:\n"
            f'    if s["artist"] == "{v["artist"]}":\n'
            '        apis.music.remove_song_from_playlist(playlist_id=playlist["playlist_id"], '
            'song_id=s["song_id"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = cells[1].replace(
            "all_pages(apis.music.show_playlists)", "apis.music.show_playlists()"
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        due = g.before(
            "SELECT x.* FROM music_playlist_songs x JOIN music_playlists p ON p.id = "
            "x.playlist_id JOIN music_songs s ON s.id = x.song_id WHERE p.owner_id = ? "
            "AND p.title = ? AND s.artist = ?",
            (v.user_id, v["title"], v["artist"]),
        )
        removed = set(ids(g.diff.removed("music_playlist_songs")))
        g.check(
            "artist_removed",
            f"All {len(due)} songs by {v['artist']} left {v['title']!r}",
            set(ids(due)) <= removed,
            f"still there: {sorted(set(ids(due)) - removed)}",
        )
        g.check_no_other_changes({"music_playlist_songs": ids(due)})


DEV: tuple[Scenario, ...] = (
    MusicCountLibraryGenre(),
    PaymentsTotalFromPartner(),
    PhoneTextSiblings(),
    MusicPlaylistRemoveArtist(),
)
