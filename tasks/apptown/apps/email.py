"""`email`: an inbox with threads, stars and archive; sending, replying, and attachments that
move to and from the `files` app."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message, PageIndex, PageLimit
from tasks.apptown.apps.common import add_login, as_bools, like_pattern, person_by_email

app = App(
    "email",
    "Your email: inbox, sent mail, threads, stars, archive, sending with file attachments.",
)
add_login(app, "email")

EmailId = Annotated[int, Arg("The email's id.")]


class EmailSummary(TypedDict):
    email_id: int
    thread_id: int
    sender_name: str
    sender_email: str
    subject: str
    sent_at: str
    is_starred: bool
    is_archived: bool
    num_attachments: int


class Attachment(TypedDict):
    attachment_id: int
    file_name: str


class Email(TypedDict):
    email_id: int
    thread_id: int
    sender_name: str
    sender_email: str
    recipients: list[str]
    subject: str
    body: str
    sent_at: str
    attachments: list[Attachment]


class Created(TypedDict):
    message: str
    id: int


_SUMMARY = """SELECT e.id AS email_id, e.thread_id, p.first_name || ' ' || p.last_name AS
    sender_name, p.email AS sender_email, e.subject, e.sent_at, r.is_starred, r.is_archived,
    (SELECT count(*) FROM email_attachments a WHERE a.email_id = e.id) AS num_attachments
    FROM email_emails e JOIN people p ON p.id = e.sender_id
    JOIN email_recipients r ON r.email_id = e.id AND r.person_id = ?"""


def _visible(ctx: Context, email_id: int) -> dict[str, Any]:
    return ctx.one(
        "SELECT e.* FROM email_emails e WHERE e.id = ? AND (e.sender_id = ? OR EXISTS (SELECT 1 "
        "FROM email_recipients r WHERE r.email_id = e.id AND r.person_id = ?))",
        (email_id, ctx.user_id, ctx.user_id),
        f"No email with email_id {email_id} in your mailbox.",
    )


def _need_files(ctx: Context, why: str) -> None:
    if "files" not in ctx.logged_in:
        raise AppError(401, f"{why} uses the files app; call apis.files.login first.")


def _deliver(
    ctx: Context, recipients: list[str], subject: str, body: str, thread: int | None
) -> int:
    people = [person_by_email(ctx, r) for r in recipients]
    if not people:
        raise AppError(422, "recipients must name at least one email address.")
    cursor = ctx.db.execute(
        "INSERT INTO email_emails (thread_id, sender_id, subject, body, sent_at)"
        " VALUES (0, ?, ?, ?, ?)",
        (ctx.user_id, subject, body, ctx.now_iso),
    )
    email_id = int(cursor.lastrowid or 0)
    ctx.db.execute(
        "UPDATE email_emails SET thread_id = ? WHERE id = ?", (thread or email_id, email_id)
    )
    for pid in sorted({p["id"] for p in people}):
        ctx.db.execute(
            "INSERT INTO email_recipients (email_id, person_id, is_starred, is_archived)"
            " VALUES (?, ?, 0, 0)",
            (email_id, pid),
        )
    return email_id


@app.api(read_only=True)
def show_inbox(
    ctx: Context,
    query: Annotated[str, Arg("Text to find in the subject or body.")] = "",
    sender_email: Annotated[str | None, Arg("Only emails from this address.")] = None,
    include_archived: Annotated[bool, Arg("Also show archived emails.")] = False,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[EmailSummary]:
    """Show emails you received, newest first (archived ones only when asked)."""
    sql = f"""{_SUMMARY} WHERE (e.subject || ' ' || e.body) LIKE ? ESCAPE '\\'
        AND (? IS NULL OR p.email = ? COLLATE NOCASE) AND (? OR r.is_archived = 0)
        ORDER BY e.sent_at DESC, e.id DESC"""
    params = (ctx.user_id, like_pattern(query), sender_email, sender_email, include_archived)
    return as_bools(ctx.page(sql, params, page_index, page_limit), "is_starred", "is_archived")


@app.api(read_only=True)
def show_sent_emails(
    ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list[Email]:
    """Show emails you sent, newest first."""
    ids = ctx.page(
        "SELECT id FROM email_emails WHERE sender_id = ? ORDER BY sent_at DESC, id DESC",
        (ctx.user_id,),
        page_index,
        page_limit,
    )
    return [show_email(ctx, r["id"]) for r in ids]


@app.api(read_only=True)
def show_email(ctx: Context, email_id: EmailId) -> Email:
    """Show one email with its recipients and attachments."""
    e = _visible(ctx, email_id)
    sender = ctx.one(
        "SELECT first_name || ' ' || last_name AS name, email FROM people WHERE id = ?",
        (e["sender_id"],),
        "Unknown sender.",
    )
    recipients = ctx.rows(
        "SELECT p.email FROM email_recipients r JOIN people p ON "
        "p.id = r.person_id WHERE r.email_id = ? ORDER BY r.id",
        (email_id,),
    )
    attachments = ctx.rows(
        "SELECT id AS attachment_id, file_name FROM email_attachments WHERE "
        "email_id = ? ORDER BY id",
        (email_id,),
    )
    return {
        "email_id": email_id,
        "thread_id": e["thread_id"],
        "sender_name": sender["name"],
        "sender_email": sender["email"],
        "recipients": [r["email"] for r in recipients],
        "subject": e["subject"],
        "body": e["body"],
        "sent_at": e["sent_at"],
        "attachments": attachments,
    }


@app.api(read_only=False)
def send_email(
    ctx: Context,
    recipients: Annotated[list[str], Arg("Email addresses to send to.")],
    subject: Annotated[str, Arg("The subject line.")],
    body: Annotated[str, Arg("The text of the email.")],
    attachment_paths: Annotated[
        list[str], Arg("Paths of your files (in the files app) to attach; needs a files login.")
    ] = [],  # noqa: B006
) -> Created:
    """Send a new email, optionally attaching files from the files app."""
    files = []
    if attachment_paths:
        _need_files(ctx, "Attaching files")
        for path in attachment_paths:
            files.append(
                ctx.one(
                    "SELECT path, content FROM files_files WHERE owner_id = ? AND path = ?",
                    (ctx.user_id, path),
                    f"No file at {path!r}.",
                )
            )
    email_id = _deliver(ctx, recipients, subject, body, None)
    for f in files:
        ctx.db.execute(
            "INSERT INTO email_attachments (email_id, file_name, content) VALUES (?, ?, ?)",
            (email_id, f["path"].rsplit("/", 1)[-1], f["content"]),
        )
    return {"message": "Email sent.", "id": email_id}


@app.api(read_only=False)
def reply_to_email(
    ctx: Context, email_id: EmailId, body: Annotated[str, Arg("The text of the reply.")]
) -> Created:
    """Reply to the sender of an email, in the same thread (subject "Re: ...")."""
    original = _visible(ctx, email_id)
    sender = ctx.one("SELECT email FROM people WHERE id = ?", (original["sender_id"],), "?")
    subject = original["subject"]
    subject = subject if subject.startswith("Re: ") else f"Re: {subject}"
    reply = _deliver(ctx, [sender["email"]], subject, body, original["thread_id"])
    return {"message": "Reply sent.", "id": reply}


def _flag(ctx: Context, email_id: int, column: str, value: bool) -> Message:
    cursor = ctx.db.execute(
        f"UPDATE email_recipients SET {column} = ? WHERE email_id = ? AND person_id = ?",
        (int(value), email_id, ctx.user_id),
    )
    if cursor.rowcount == 0:
        raise AppError(404, f"No email with email_id {email_id} in your inbox.")
    return {"message": f"Email {email_id} updated."}


@app.api(read_only=False)
def star_email(
    ctx: Context,
    email_id: EmailId,
    starred: Annotated[bool, Arg("True to star, false to unstar.")] = True,
) -> Message:
    """Star or unstar an email in your inbox."""
    return _flag(ctx, email_id, "is_starred", starred)


@app.api(read_only=False)
def archive_email(
    ctx: Context,
    email_id: EmailId,
    archived: Annotated[bool, Arg("True to archive, false to move back to the inbox.")] = True,
) -> Message:
    """Archive an email in your inbox (or un-archive it)."""
    return _flag(ctx, email_id, "is_archived", archived)


@app.api(read_only=False)
def download_attachment(
    ctx: Context,
    attachment_id: Annotated[int, Arg("The attachment's id (from show_email).")],
    path: Annotated[str, Arg("Where to save it in the files app, e.g. /downloads/a.txt.")],
) -> Message:
    """Save an email attachment as a file in the files app (needs a files login)."""
    _need_files(ctx, "Downloading attachments")
    attachment = ctx.one(
        "SELECT * FROM email_attachments WHERE id = ?",
        (attachment_id,),
        f"No attachment with attachment_id {attachment_id}.",
    )
    _visible(ctx, attachment["email_id"])
    if not path.startswith("/") or path.endswith("/"):
        raise AppError(422, f"path must be an absolute file path, got {path!r}.")
    if ctx.db.execute(
        "SELECT 1 FROM files_files WHERE owner_id = ? AND path = ?", (ctx.user_id, path)
    ).fetchone():
        raise AppError(422, f"A file already exists at {path!r}.")
    ctx.db.execute(
        "INSERT INTO files_files (owner_id, path, content, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (ctx.user_id, path, attachment["content"], ctx.now_iso, ctx.now_iso),
    )
    return {"message": f"Saved {attachment['file_name']} to {path}."}
