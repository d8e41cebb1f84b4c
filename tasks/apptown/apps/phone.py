"""`phone`: contacts (with how each contact is related to you) and text messages."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message, PageIndex, PageLimit
from tasks.apptown.apps.common import add_login, like_pattern, person_by_phone
from tasks.apptown.people import RELATIONSHIPS

app = App(
    "phone",
    "Your phone: contacts with their relationships to you (roommate, partner, sibling, parent, "
    "child, coworker, manager, friend), and text messages.",
)
add_login(app, "phone_number")

Relationship = Annotated[
    str | None, Arg("Only contacts with this relationship.", choices=RELATIONSHIPS)
]


class Contact(TypedDict):
    contact_id: int
    first_name: str
    last_name: str
    email: str | None
    phone_number: str
    relationships: list[str]
    birthday: str | None
    created_at: str


class ContactCreated(TypedDict):
    message: str
    contact_id: int


class TextMessage(TypedDict):
    message_id: int
    sender_name: str
    sender_phone_number: str
    receiver_name: str
    receiver_phone_number: str
    body: str
    sent_at: str


class TextSent(TypedDict):
    message: str
    message_id: int


_CONTACT = """SELECT id AS contact_id, first_name, last_name, email, phone_number, relationships,
    birthday, created_at FROM phone_contacts"""

_MESSAGE = """SELECT m.id AS message_id, s.first_name || ' ' || s.last_name AS sender_name,
    s.phone_number AS sender_phone_number, r.first_name || ' ' || r.last_name AS receiver_name,
    r.phone_number AS receiver_phone_number, m.body, m.sent_at
    FROM phone_messages m JOIN people s ON s.id = m.sender_id
    JOIN people r ON r.id = m.receiver_id"""


def _contacts(rows: list[Any]) -> list[Any]:
    for row in rows:
        row["relationships"] = json.loads(row["relationships"])
    return rows


def _own_contact(ctx: Context, contact_id: int) -> Any:
    return _contacts(
        [
            ctx.one(
                f"{_CONTACT} WHERE id = ? AND owner_id = ?",
                (contact_id, ctx.user_id),
                f"No contact with contact_id {contact_id} in your phone.",
            )
        ]
    )[0]


@app.api(read_only=True)
def search_contacts(
    ctx: Context,
    query: Annotated[str, Arg("Text to find in the name, email or phone number.")] = "",
    relationship: Relationship = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[Contact]:
    """Search your contacts, sorted by first and last name. An empty query matches everyone."""
    sql = f"""{_CONTACT} WHERE owner_id = ? AND (first_name || ' ' || last_name || ' ' ||
        coalesce(email, '') || ' ' || phone_number) LIKE ? ESCAPE '\\'"""
    params: tuple[Any, ...] = (ctx.user_id, like_pattern(query))
    if relationship is not None:
        sql += " AND EXISTS (SELECT 1 FROM json_each(relationships) WHERE value = ?)"
        params += (relationship,)
    return _contacts(
        ctx.page(f"{sql} ORDER BY first_name, last_name, id", params, page_index, page_limit)
    )


@app.api(read_only=True)
def show_contact(ctx: Context, contact_id: Annotated[int, Arg("The contact to show.")]) -> Contact:
    """Show one contact."""
    return _own_contact(ctx, contact_id)


@app.api(read_only=True, login=False)
def show_contact_relationships(ctx: Context) -> list[str]:
    """List the relationship labels a contact can have."""
    return list(RELATIONSHIPS)


@app.api(read_only=False)
def add_contact(
    ctx: Context,
    first_name: Annotated[str, Arg("First name.")],
    last_name: Annotated[str, Arg("Last name.")],
    phone_number: Annotated[str, Arg("Phone number (digits).")],
    email: Annotated[str | None, Arg("Email address.")] = None,
    relationships: Annotated[list[str], Arg("How this person is related to you.")] = [],  # noqa: B006
    birthday: Annotated[str | None, Arg("Birthday as YYYY-MM-DD.")] = None,
) -> ContactCreated:
    """Add a contact to your phone."""
    _check_relationships(relationships)
    digits = "".join(c for c in phone_number if c.isdigit())
    if len(digits) != 10:
        raise AppError(422, f"phone_number must have 10 digits, got {phone_number!r}.")
    exists = ctx.db.execute(
        "SELECT id FROM phone_contacts WHERE owner_id = ? AND phone_number = ?",
        (ctx.user_id, digits),
    ).fetchone()
    if exists:
        raise AppError(
            422, f"You already have a contact with number {digits} (contact_id {exists['id']})."
        )
    cursor = ctx.db.execute(
        "INSERT INTO phone_contacts (owner_id, first_name, last_name, email, phone_number, "
        "relationships, birthday, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            ctx.user_id,
            first_name,
            last_name,
            email,
            digits,
            json.dumps(sorted(relationships)),
            birthday,
            ctx.now_iso,
        ),
    )
    return {"message": "Contact added.", "contact_id": int(cursor.lastrowid or 0)}


@app.api(read_only=False)
def update_contact(
    ctx: Context,
    contact_id: Annotated[int, Arg("The contact to update.")],
    first_name: Annotated[str | None, Arg("New first name.")] = None,
    last_name: Annotated[str | None, Arg("New last name.")] = None,
    phone_number: Annotated[str | None, Arg("New phone number.")] = None,
    email: Annotated[str | None, Arg("New email address.")] = None,
    relationships: Annotated[list[str] | None, Arg("New relationships (replaces the old).")] = None,
) -> Message:
    """Update the given fields of a contact; fields left out keep their value."""
    contact = _own_contact(ctx, contact_id)
    changes = {
        "first_name": first_name,
        "last_name": last_name,
        "phone_number": phone_number,
        "email": email,
    }
    values = {k: v for k, v in changes.items() if v is not None}
    if relationships is not None:
        _check_relationships(relationships)
        values["relationships"] = json.dumps(sorted(relationships))
    if not values:
        raise AppError(422, "Nothing to update: pass at least one field.")
    assignments = ", ".join(f"{k} = ?" for k in values)
    ctx.db.execute(
        f"UPDATE phone_contacts SET {assignments} WHERE id = ?",
        (*values.values(), contact["contact_id"]),
    )
    return {"message": "Contact updated."}


@app.api(read_only=False)
def delete_contact(
    ctx: Context, contact_id: Annotated[int, Arg("The contact to delete.")]
) -> Message:
    """Delete a contact from your phone."""
    _own_contact(ctx, contact_id)
    ctx.db.execute("DELETE FROM phone_contacts WHERE id = ?", (contact_id,))
    return {"message": "Contact deleted."}


@app.api(read_only=True)
def show_text_messages(
    ctx: Context,
    phone_number: Annotated[str | None, Arg("Only messages with this phone number.")] = None,
    query: Annotated[str, Arg("Text to find in the message body.")] = "",
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[TextMessage]:
    """Show the text messages you sent or received, newest first."""
    sql = f"{_MESSAGE} WHERE (m.sender_id = ? OR m.receiver_id = ?) AND m.body LIKE ? ESCAPE '\\'"
    params: tuple[Any, ...] = (ctx.user_id, ctx.user_id, like_pattern(query))
    if phone_number is not None:
        other = person_by_phone(ctx, phone_number)["id"]
        sql += " AND (m.sender_id = ? OR m.receiver_id = ?)"
        params += (other, other)
    return ctx.page(f"{sql} ORDER BY m.sent_at DESC, m.id DESC", params, page_index, page_limit)


@app.api(read_only=False)
def send_text_message(
    ctx: Context,
    phone_number: Annotated[str, Arg("The recipient's phone number.")],
    body: Annotated[str, Arg("The text to send.")],
) -> TextSent:
    """Send a text message."""
    receiver = person_by_phone(ctx, phone_number)
    if not body.strip():
        raise AppError(422, "body must not be empty.")
    cursor = ctx.db.execute(
        "INSERT INTO phone_messages (sender_id, receiver_id, body, sent_at) VALUES (?, ?, ?, ?)",
        (ctx.user_id, receiver["id"], body, ctx.now_iso),
    )
    return {"message": "Text message sent.", "message_id": int(cursor.lastrowid or 0)}


@app.api(read_only=False)
def delete_text_message(
    ctx: Context, message_id: Annotated[int, Arg("The message to delete.")]
) -> Message:
    """Delete a text message you sent or received."""
    ctx.one(
        "SELECT id FROM phone_messages WHERE id = ? AND (sender_id = ? OR receiver_id = ?)",
        (message_id, ctx.user_id, ctx.user_id),
        f"No text message with id {message_id}.",
    )
    ctx.db.execute("DELETE FROM phone_messages WHERE id = ?", (message_id,))
    return {"message": "Text message deleted."}


def _check_relationships(labels: list[str]) -> None:
    bad = [x for x in labels if x not in RELATIONSHIPS]
    if bad:
        raise AppError(422, f"Unknown relationship(s) {bad}; use any of {list(RELATIONSHIPS)}.")
