"""The SQLite schema of AppTown: one database, one table prefix per app, plus a change log.

Every table has an integer primary key `id`, and triggers log every insert, update and delete
into `_changes`. Grading reads that log to diff only the rows a rollout touched against the
task's initial state, which is how the collateral-damage check covers every app's state in
O(changes) time instead of re-reading the whole world.
"""

from __future__ import annotations

import sqlite3

TABLES: dict[str, str] = {
    # The people of the world (AppWorld's "admin" data): every app refers to them by id.
    "people": """first_name TEXT NOT NULL, last_name TEXT NOT NULL, email TEXT NOT NULL UNIQUE,
        phone_number TEXT NOT NULL UNIQUE, birthday TEXT NOT NULL""",
    "accounts": "person_id INTEGER NOT NULL, app TEXT NOT NULL, password TEXT NOT NULL",
    "supervisor_addresses": """person_id INTEGER NOT NULL, name TEXT NOT NULL,
        street_address TEXT NOT NULL, city TEXT NOT NULL, zip_code TEXT NOT NULL""",
    "supervisor_cards": """person_id INTEGER NOT NULL, card_name TEXT NOT NULL,
        owner_name TEXT NOT NULL, card_number TEXT NOT NULL, expiry_date TEXT NOT NULL,
        cvv TEXT NOT NULL""",
    "phone_contacts": """owner_id INTEGER NOT NULL, first_name TEXT NOT NULL,
        last_name TEXT NOT NULL, email TEXT, phone_number TEXT NOT NULL,
        relationships TEXT NOT NULL, birthday TEXT, created_at TEXT NOT NULL""",
    "phone_messages": """sender_id INTEGER NOT NULL, receiver_id INTEGER NOT NULL,
        body TEXT NOT NULL, sent_at TEXT NOT NULL""",
    "payments_accounts": "person_id INTEGER NOT NULL UNIQUE, balance REAL NOT NULL",
    "payments_friends": "person_id INTEGER NOT NULL, friend_id INTEGER NOT NULL",
    "payments_transactions": """sender_id INTEGER NOT NULL, receiver_id INTEGER NOT NULL,
        amount REAL NOT NULL, description TEXT NOT NULL, created_at TEXT NOT NULL,
        is_private INTEGER NOT NULL""",
    "payments_likes": """transaction_id INTEGER NOT NULL, person_id INTEGER NOT NULL,
        created_at TEXT NOT NULL""",
    "payments_requests": """requester_id INTEGER NOT NULL, payer_id INTEGER NOT NULL,
        amount REAL NOT NULL, description TEXT NOT NULL, created_at TEXT NOT NULL,
        status TEXT NOT NULL, reminded_at TEXT, resolved_at TEXT""",
    "music_albums": """title TEXT NOT NULL, artist TEXT NOT NULL, genre TEXT NOT NULL,
        release_year INTEGER NOT NULL""",
    "music_songs": """title TEXT NOT NULL, artist TEXT NOT NULL, album_id INTEGER NOT NULL,
        genre TEXT NOT NULL, duration_s INTEGER NOT NULL, release_year INTEGER NOT NULL,
        play_count INTEGER NOT NULL""",
    "music_library": "person_id INTEGER NOT NULL, song_id INTEGER NOT NULL, added_at TEXT NOT NULL",
    "music_likes": "person_id INTEGER NOT NULL, song_id INTEGER NOT NULL, created_at TEXT NOT NULL",
    "music_playlists": """owner_id INTEGER NOT NULL, title TEXT NOT NULL,
        is_public INTEGER NOT NULL, created_at TEXT NOT NULL""",
    "music_playlist_songs": """playlist_id INTEGER NOT NULL, song_id INTEGER NOT NULL,
        position INTEGER NOT NULL""",
    "email_emails": """thread_id INTEGER NOT NULL, sender_id INTEGER NOT NULL,
        subject TEXT NOT NULL, body TEXT NOT NULL, sent_at TEXT NOT NULL""",
    "email_recipients": """email_id INTEGER NOT NULL, person_id INTEGER NOT NULL,
        is_starred INTEGER NOT NULL, is_archived INTEGER NOT NULL""",
    "email_attachments": """email_id INTEGER NOT NULL, file_name TEXT NOT NULL,
        content TEXT NOT NULL""",
    "files_files": """owner_id INTEGER NOT NULL, path TEXT NOT NULL, content TEXT NOT NULL,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL""",
    "todo_lists": "owner_id INTEGER NOT NULL, name TEXT NOT NULL, created_at TEXT NOT NULL",
    "todo_items": """list_id INTEGER NOT NULL, title TEXT NOT NULL, notes TEXT NOT NULL,
        due_date TEXT, priority TEXT NOT NULL, is_completed INTEGER NOT NULL,
        completed_at TEXT, created_at TEXT NOT NULL""",
}

INDEXES = [
    "phone_contacts(owner_id)",
    "phone_messages(sender_id)",
    "phone_messages(receiver_id)",
    "payments_transactions(sender_id)",
    "payments_transactions(receiver_id)",
    "payments_likes(transaction_id)",
    "payments_requests(requester_id)",
    "payments_requests(payer_id)",
    "music_library(person_id)",
    "music_likes(person_id)",
    "music_playlists(owner_id)",
    "music_playlist_songs(playlist_id)",
    "email_recipients(person_id)",
    "email_attachments(email_id)",
    "files_files(owner_id)",
    "todo_lists(owner_id)",
    "todo_items(list_id)",
]


def create_schema(db: sqlite3.Connection) -> None:
    """Create every table and index (no change-log triggers yet: see `track_changes`)."""
    for name, columns in TABLES.items():
        db.execute(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, {columns})")
    for i, target in enumerate(INDEXES):
        db.execute(f"CREATE INDEX ix_{i} ON {target}")
    db.execute("CREATE TABLE _changes (tbl TEXT NOT NULL, row_id INTEGER NOT NULL)")


def track_changes(db: sqlite3.Connection) -> None:
    """Install the triggers that log every row change into `_changes`."""
    for name in TABLES:
        db.executescript(
            f"""
            CREATE TRIGGER {name}_ins AFTER INSERT ON {name}
              BEGIN INSERT INTO _changes VALUES ('{name}', NEW.id); END;
            CREATE TRIGGER {name}_upd AFTER UPDATE ON {name}
              BEGIN INSERT INTO _changes VALUES ('{name}', OLD.id), ('{name}', NEW.id); END;
            CREATE TRIGGER {name}_del AFTER DELETE ON {name}
              BEGIN INSERT INTO _changes VALUES ('{name}', OLD.id); END;
            """
        )
