"""`supervisor`: the person the agent works for: profile, app passwords, addresses, cards, and
`complete_task`, which ends the episode and records the answer."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message

app = App(
    "supervisor",
    "Information about the person you work for (profile, app passwords, addresses, payment "
    "cards), and complete_task to finish the task.",
)


class Profile(TypedDict):
    first_name: str
    last_name: str
    email: str
    phone_number: str
    birthday: str


class AccountPassword(TypedDict):
    account_name: str
    password: str


class Address(TypedDict):
    name: str
    street_address: str
    city: str
    zip_code: str


class PaymentCard(TypedDict):
    card_name: str
    owner_name: str
    card_number: str
    expiry_date: str
    cvv: str


@app.api(read_only=True, login=False)
def show_profile(ctx: Context) -> Profile:
    """Show the supervisor's profile: name, email, phone number and birthday."""
    return ctx.one(
        "SELECT first_name, last_name, email, phone_number, birthday FROM people WHERE id = ?",
        (ctx.user_id,),
        "The supervisor's profile is missing.",
    )


@app.api(read_only=True, login=False)
def show_account_passwords(ctx: Context) -> list[AccountPassword]:
    """Show the supervisor's password for every app (account_name is the app's name)."""
    return ctx.rows(
        "SELECT app AS account_name, password FROM accounts WHERE person_id = ? ORDER BY app",
        (ctx.user_id,),
    )


@app.api(read_only=True, login=False)
def show_addresses(ctx: Context) -> list[Address]:
    """Show the supervisor's saved addresses."""
    return ctx.rows(
        "SELECT name, street_address, city, zip_code FROM supervisor_addresses "
        "WHERE person_id = ? ORDER BY id",
        (ctx.user_id,),
    )


@app.api(read_only=True, login=False)
def show_payment_cards(ctx: Context) -> list[PaymentCard]:
    """Show the supervisor's payment cards."""
    return ctx.rows(
        "SELECT card_name, owner_name, card_number, expiry_date, cvv FROM supervisor_cards "
        "WHERE person_id = ? ORDER BY id",
        (ctx.user_id,),
    )


@app.api(read_only=False, login=False)
def complete_task(
    ctx: Context,
    answer: Annotated[
        Any,
        Arg(
            "The answer, when the task asks a question (a number, a string or a list); "
            "leave it out when the task only asks you to do something."
        ),
    ] = None,
) -> Message:
    """Mark the task as complete, submitting the answer if the task asks for one. Call it once,
    at the very end: the episode ends when it is called."""
    if ctx.completed:
        raise AppError(409, "The task is already complete.")
    ctx.completed = True
    ctx.answer = answer
    return {"message": "Task marked complete."}
