"""The seeded AppTown world: its society and every app's data, built once into an in-memory
SQLite template that tasks fork with SQLite's backup API (a page copy: about a millisecond).

Same seed, same world: all randomness flows from one `random.Random(seed)`, consumed in a fixed
order, and every timestamp is relative to the world's fixed clock `NOW`.
"""

from __future__ import annotations

import json
import random
import sqlite3
import string
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tasks.apptown import content
from tasks.apptown.people import Person, Society, generate_society
from tasks.apptown.schema import create_schema, track_changes

NOW = datetime(2024, 5, 15, 10, 0, 0)
USER_APPS = ("phone", "payments", "music", "email", "files", "todo")


class Snapshot:
    """A read-only in-memory database that many threads can fork and query (one at a time)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db
        self._lock = threading.Lock()

    def fork(self) -> sqlite3.Connection:
        """A private, writable copy of this snapshot, byte for byte."""
        copy = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.backup(copy)
        copy.row_factory = sqlite3.Row
        return copy

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run a read-only query and return the rows as dicts."""
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, params)]


@dataclass
class World:
    """A generated society plus the template database holding every app's initial state."""

    seed: int
    society: Society
    template: Snapshot
    now: datetime = NOW

    @classmethod
    def build(cls, seed: int = 0, n_people: int = 72) -> World:
        """Generate the world for `seed`; deterministic, about a quarter of a second."""
        rng = random.Random(seed)
        society = generate_society(rng, n_people)
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        db.row_factory = sqlite3.Row
        create_schema(db)
        db.execute("BEGIN")
        for populate in (_directory, _phone, _payments, _music, _email, _files, _todo):
            populate(db, society, rng)
        db.execute("COMMIT")
        track_changes(db)
        return cls(seed, society, Snapshot(db))

    def library_songs(self, person_id: int) -> list[dict[str, Any]]:
        """The songs in a person's music library (their `music_songs` rows), by title then id."""
        return self.template.rows(
            "SELECT s.* FROM music_library l JOIN music_songs s ON s.id = l.song_id "
            "WHERE l.person_id = ? ORDER BY s.title, s.id",
            (person_id,),
        )

    def person(self, pid: int) -> Person:
        person = self.society.people[pid - 1]
        assert person.id == pid, (person, pid)
        return person

    def find(self, name: str) -> Person:
        """The person with full name `name`."""
        return next(p for p in self.society.people if p.name == name)


def _past(rng: random.Random, max_days: int, min_days: int = 0) -> str:
    seconds = rng.randrange(min_days * 86400, max_days * 86400)
    return (NOW - timedelta(seconds=seconds)).isoformat(timespec="seconds")


def insert_row(db: sqlite3.Connection, table: str, **values: Any) -> int:
    """Insert one row and return its id."""
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    cursor = db.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(values.values()))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _directory(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    alphabet = string.ascii_letters + string.digits
    streets = ("Maple Ave", "Harbor St", "Cedar Ln", "Orchard Rd", "Bay View Dr")
    for p in society.people:
        insert_row(
            db,
            "people",
            id=p.id,
            first_name=p.first_name,
            last_name=p.last_name,
            email=p.email,
            phone_number=p.phone_number,
            birthday=p.birthday,
        )
        for app in USER_APPS:
            password = "".join(rng.choice(alphabet) for _ in range(10))
            insert_row(db, "accounts", person_id=p.id, app=app, password=password)
        insert_row(
            db,
            "supervisor_addresses",
            person_id=p.id,
            name="Home",
            street_address=f"{rng.randint(1, 999)} {rng.choice(streets)}",
            city="Appleton",
            zip_code=f"{rng.randint(10000, 99999)}",
        )
        for card_name in ("Everyday Visa", "Travel Mastercard")[: rng.randint(1, 2)]:
            insert_row(
                db,
                "supervisor_cards",
                person_id=p.id,
                card_name=card_name,
                owner_name=p.name,
                card_number="".join(rng.choices(string.digits, k=16)),
                expiry_date=f"{rng.randint(1, 12):02d}/{rng.randint(25, 29)}",
                cvv="".join(rng.choices(string.digits, k=3)),
            )


def _contacts_of(society: Society, pid: int) -> list[int]:
    return sorted(b for (a, b) in society.relations if a == pid)


def _phone(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    for owner in society.people:
        related = _contacts_of(society, owner.id)
        strangers = [p.id for p in society.people if p.id not in related and p.id != owner.id]
        for pid in related + rng.sample(strangers, 3):
            p = society.people[pid - 1]
            labels = sorted(society.relations.get((owner.id, pid), set()))
            insert_row(
                db,
                "phone_contacts",
                owner_id=owner.id,
                first_name=p.first_name,
                last_name=p.last_name,
                email=p.email,
                phone_number=p.phone_number,
                relationships=json.dumps(labels),
                birthday=p.birthday,
                created_at=_past(rng, 900, 200),
            )
        for _ in range(6):
            body = rng.choice(content.TEXT_BODIES).format(day=rng.choice(content.DAYS))
            insert_row(
                db,
                "phone_messages",
                sender_id=owner.id,
                receiver_id=rng.choice(related),
                body=body,
                sent_at=_past(rng, 60),
            )


def _payments(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    everyone = [p.id for p in society.people]
    for p in society.people:
        insert_row(db, "payments_accounts", person_id=p.id, balance=round(rng.uniform(50, 2500), 2))
    for p in society.people:
        contacts = _contacts_of(society, p.id)
        friends = rng.sample(contacts, min(5, len(contacts))) + rng.sample(everyone, 2)
        for f in sorted(set(friends) - {p.id}):
            insert_row(db, "payments_friends", person_id=p.id, friend_id=f)
        for _ in range(6):
            tid = insert_row(
                db,
                "payments_transactions",
                sender_id=p.id,
                receiver_id=rng.choice(contacts),
                amount=round(rng.uniform(5, 120), 2),
                description=rng.choice(content.PAYMENT_DESCRIPTIONS),
                created_at=_past(rng, 120),
                is_private=int(rng.random() < 0.2),
            )
            for liker in rng.sample(everyone, rng.randint(0, 2)):
                insert_row(
                    db,
                    "payments_likes",
                    transaction_id=tid,
                    person_id=liker,
                    created_at=_past(rng, 5),
                )
        for _ in range(3):
            status = rng.choice(("pending", "pending", "approved", "declined"))
            insert_row(
                db,
                "payments_requests",
                requester_id=p.id,
                payer_id=rng.choice(contacts),
                amount=round(rng.uniform(5, 90), 2),
                description=rng.choice(content.PAYMENT_DESCRIPTIONS),
                created_at=_past(rng, 60, 10),
                status=status,
                reminded_at=None,
                resolved_at=None if status == "pending" else _past(rng, 9),
            )


def _music(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    titles: set[str] = set()
    for i, artist in enumerate(content.ARTISTS):
        for _ in range(2):
            genre = content.GENRES[(i + rng.randint(0, 1)) % len(content.GENRES)]
            year = rng.randint(1995, 2023)
            album_title = f"{rng.choice(content.SONG_WORDS)} {rng.choice(content.SONG_NOUNS)}"
            album = insert_row(
                db, "music_albums", title=album_title, artist=artist, genre=genre, release_year=year
            )
            for _ in range(5):
                title = album_title
                while title in titles:
                    title = f"{rng.choice(content.SONG_WORDS)} {rng.choice(content.SONG_NOUNS)}"
                titles.add(title)
                insert_row(
                    db,
                    "music_songs",
                    title=title,
                    artist=artist,
                    album_id=album,
                    genre=genre,
                    duration_s=rng.randint(140, 330),
                    release_year=year,
                    play_count=rng.randint(1000, 900000),
                )
    songs = list(range(1, len(titles) + 1))
    for p in society.people:
        for sid in sorted(rng.sample(songs, rng.randint(12, 30))):
            insert_row(db, "music_library", person_id=p.id, song_id=sid, added_at=_past(rng, 700))
        for sid in sorted(rng.sample(songs, rng.randint(8, 20))):
            insert_row(db, "music_likes", person_id=p.id, song_id=sid, created_at=_past(rng, 700))
        for k in range(rng.randint(2, 8)):
            title = f"{rng.choice(content.SONG_WORDS)} {rng.choice(('Mix', 'Vibes', 'Jams'))} {k}"
            pl = insert_row(
                db,
                "music_playlists",
                owner_id=p.id,
                title=title,
                is_public=int(rng.random() < 0.5),
                created_at=_past(rng, 400),
            )
            for pos, sid in enumerate(rng.sample(songs, rng.randint(4, 12))):
                insert_row(db, "music_playlist_songs", playlist_id=pl, song_id=sid, position=pos)


def _email(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    for p in society.people:
        contacts = _contacts_of(society, p.id)
        for _ in range(5):
            subject, body = rng.choice(content.EMAIL_TOPICS)
            sender = rng.choice(contacts)
            eid = insert_row(
                db,
                "email_emails",
                thread_id=0,
                sender_id=sender,
                subject=subject,
                body=body,
                sent_at=_past(rng, 90),
            )
            db.execute("UPDATE email_emails SET thread_id = ? WHERE id = ?", (eid, eid))
            insert_row(
                db,
                "email_recipients",
                email_id=eid,
                person_id=p.id,
                is_starred=0,
                is_archived=int(rng.random() < 0.2),
            )
            if rng.random() < 0.3:
                insert_row(
                    db,
                    "email_attachments",
                    email_id=eid,
                    file_name="notes.txt",
                    content=f"Notes about {subject.lower()}.",
                )


def _files(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    for p in society.people:
        for path, text in rng.sample(content.FILE_TEMPLATES, rng.randint(3, 6)):
            created = _past(rng, 500, 30)
            insert_row(
                db,
                "files_files",
                owner_id=p.id,
                path=path,
                content=text,
                created_at=created,
                updated_at=created,
            )


def _todo(db: sqlite3.Connection, society: Society, rng: random.Random) -> None:
    for p in society.people:
        for name, titles in rng.sample(content.TODO_LISTS, 2):
            lid = insert_row(db, "todo_lists", owner_id=p.id, name=name, created_at=_past(rng, 300))
            for title in rng.sample(titles, rng.randint(3, 6)):
                done = rng.random() < 0.3
                due = (NOW + timedelta(days=rng.randint(-20, 30))).date().isoformat()
                insert_row(
                    db,
                    "todo_items",
                    list_id=lid,
                    title=title,
                    notes="",
                    due_date=due,
                    priority=rng.choice(("low", "normal", "high")),
                    is_completed=int(done),
                    completed_at=_past(rng, 20) if done else None,
                    created_at=_past(rng, 200, 25),
                )
