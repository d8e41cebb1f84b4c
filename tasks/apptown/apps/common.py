"""Pieces every user app shares: login/logout and looking people up by email or phone.

No `from __future__ import annotations` here: `add_login` builds its parameters' docs at run
time, so its annotations must be evaluated where they are defined.
"""

from typing import Annotated, Any

from tasks.apptown.api import App, AppError, Arg, Context, Message


def add_login(app: App, username_field: str) -> None:
    """Register `login` and `logout` on `app`; usernames are the account's `username_field`."""
    what = "phone number" if username_field == "phone_number" else "email address"

    def login(
        ctx: Context,
        username: Annotated[str, Arg(f"Your {what}.")],
        password: Annotated[str, Arg("Your password for this app.")],
    ) -> Message:
        row = ctx.db.execute(
            f"SELECT a.password FROM people p JOIN accounts a ON a.person_id = p.id "
            f"WHERE p.{username_field} = ? AND a.app = ? AND p.id = ?",
            (username, app.name, ctx.user_id),
        ).fetchone()
        if row is None or row["password"] != password:
            raise AppError(401, f"Invalid username or password for {app.name}.")
        ctx.logged_in.add(app.name)
        return {"message": f"Logged in to {app.name}."}

    def logout(ctx: Context) -> Message:
        ctx.logged_in.discard(app.name)
        return {"message": f"Logged out of {app.name}."}

    login.__doc__ = (
        f"Log in to {app.name} with your {what} and password. Every other {app.name} API "
        f"needs it; the session lasts until logout."
    )
    logout.__doc__ = f"Log out of {app.name}."
    app.api(read_only=True, login=False)(login)
    app.api(read_only=True)(logout)


def person_by_email(ctx: Context, email: str) -> dict[str, Any]:
    """The person with this email address, or a 404."""
    return ctx.one(
        "SELECT * FROM people WHERE email = ? COLLATE NOCASE",
        (email.strip(),),
        f"No user with email {email!r}.",
    )


def person_by_phone(ctx: Context, phone_number: str) -> dict[str, Any]:
    """The person with this phone number, or a 404."""
    digits = "".join(c for c in phone_number if c.isdigit())
    return ctx.one(
        "SELECT * FROM people WHERE phone_number = ?",
        (digits,),
        f"No phone account with number {phone_number!r}.",
    )


def as_bools(rows: list[Any], *keys: str) -> list[Any]:
    """SQLite stores booleans as 0/1; show them to the agent as true/false."""
    for row in rows:
        for key in keys:
            row[key] = bool(row[key])
    return rows


def like_pattern(text: str) -> str:
    """A case-insensitive LIKE pattern matching `text` anywhere (with % and _ escaped)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"
