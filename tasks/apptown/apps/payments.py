"""`payments`: a Venmo-like app: balance, transactions, likes, a social feed of payment friends,
and payment requests (sent, received, reminders, approve, decline)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message, PageIndex, PageLimit
from tasks.apptown.apps.common import add_login, as_bools, like_pattern, person_by_email

app = App(
    "payments",
    "Send and request money: balance, transactions, likes, your payment friends' social feed, "
    "and payment requests.",
)
add_login(app, "email")

Amount = Annotated[float, Arg("Amount in dollars.", ge=0.01, le=10000)]
RequestStatus = Annotated[
    str | None, Arg("Only requests with this status.", choices=("pending", "approved", "declined"))
]


class Balance(TypedDict):
    balance: float


class Friend(TypedDict):
    name: str
    email: str


class Transaction(TypedDict):
    transaction_id: int
    sender_name: str
    sender_email: str
    receiver_name: str
    receiver_email: str
    amount: float
    description: str
    created_at: str
    is_private: bool
    like_count: int
    liked_by_me: bool


class PaymentRequest(TypedDict):
    payment_request_id: int
    requester_name: str
    requester_email: str
    payer_name: str
    payer_email: str
    amount: float
    description: str
    status: str
    created_at: str
    reminded_at: str | None


class Created(TypedDict):
    message: str
    id: int


_TRANSACTION = """SELECT t.id AS transaction_id, s.first_name || ' ' || s.last_name AS sender_name,
    s.email AS sender_email, r.first_name || ' ' || r.last_name AS receiver_name,
    r.email AS receiver_email, t.amount, t.description, t.created_at, t.is_private,
    (SELECT count(*) FROM payments_likes l WHERE l.transaction_id = t.id) AS like_count,
    EXISTS (SELECT 1 FROM payments_likes l WHERE l.transaction_id = t.id AND l.person_id = ?)
      AS liked_by_me
    FROM payments_transactions t JOIN people s ON s.id = t.sender_id
    JOIN people r ON r.id = t.receiver_id"""

_REQUEST = """SELECT q.id AS payment_request_id,
    a.first_name || ' ' || a.last_name AS requester_name, a.email AS requester_email,
    b.first_name || ' ' || b.last_name AS payer_name, b.email AS payer_email, q.amount,
    q.description, q.status, q.created_at, q.reminded_at
    FROM payments_requests q JOIN people a ON a.id = q.requester_id
    JOIN people b ON b.id = q.payer_id"""


def _transactions(ctx: Context, where: str, params: tuple[Any, ...], page: tuple[int, int]) -> Any:
    sql = f"{_TRANSACTION} WHERE {where} ORDER BY t.created_at DESC, t.id DESC"
    return as_bools(ctx.page(sql, (ctx.user_id, *params), *page), "is_private", "liked_by_me")


def _visible_transaction(ctx: Context, transaction_id: int) -> dict[str, Any]:
    return ctx.one(
        "SELECT * FROM payments_transactions WHERE id = ? AND (sender_id = ? OR receiver_id = ? "
        "OR (is_private = 0 AND (sender_id IN (SELECT friend_id FROM payments_friends "
        "WHERE person_id = ?) OR receiver_id IN (SELECT friend_id FROM payments_friends "
        "WHERE person_id = ?))))",
        (transaction_id, *[ctx.user_id] * 4),
        f"No transaction with transaction_id {transaction_id} that you can see.",
    )


def _move_money(ctx: Context, sender: int, receiver: int, amount: float, what: str) -> int:
    balance = ctx.db.execute(
        "SELECT balance FROM payments_accounts WHERE person_id = ?", (sender,)
    ).fetchone()["balance"]
    if balance < amount:
        raise AppError(422, f"Insufficient balance ({balance:.2f}) to pay {amount:.2f}.")
    for pid, delta in ((sender, -amount), (receiver, amount)):
        ctx.db.execute(
            "UPDATE payments_accounts SET balance = round(balance + ?, 2) WHERE person_id = ?",
            (delta, pid),
        )
    cursor = ctx.db.execute(
        "INSERT INTO payments_transactions (sender_id, receiver_id, amount, description, "
        "created_at, is_private) VALUES (?, ?, ?, ?, ?, 0)",
        (sender, receiver, round(amount, 2), what, ctx.now_iso),
    )
    return int(cursor.lastrowid or 0)


@app.api(read_only=True)
def show_balance(ctx: Context) -> Balance:
    """Show your current balance in dollars."""
    return ctx.one(
        "SELECT balance FROM payments_accounts WHERE person_id = ?",
        (ctx.user_id,),
        "You have no payments account.",
    )


@app.api(read_only=True)
def show_friends(
    ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list[Friend]:
    """List your payment friends (people you follow in this app), sorted by name."""
    return ctx.page(
        "SELECT p.first_name || ' ' || p.last_name AS name, p.email FROM "
        "payments_friends f JOIN people p ON p.id = f.friend_id WHERE f.person_id = ? "
        "ORDER BY name",
        (ctx.user_id,),
        page_index,
        page_limit,
    )


@app.api(read_only=True)
def show_transactions(
    ctx: Context,
    direction: Annotated[
        str, Arg("Which of your transactions.", choices=("all", "sent", "received"))
    ] = "all",
    user_email: Annotated[str | None, Arg("Only transactions with this user.")] = None,
    query: Annotated[str, Arg("Text to find in the description.")] = "",
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[Transaction]:
    """Show transactions you sent or received, newest first."""
    params: tuple[Any, ...]
    if direction == "all":
        where, params = "(t.sender_id = ? OR t.receiver_id = ?)", (ctx.user_id, ctx.user_id)
    else:
        column = "t.sender_id" if direction == "sent" else "t.receiver_id"
        where, params = f"{column} = ?", (ctx.user_id,)
    where += " AND t.description LIKE ? ESCAPE '\\'"
    params += (like_pattern(query),)
    if user_email is not None:
        other = person_by_email(ctx, user_email)["id"]
        where += " AND (t.sender_id = ? OR t.receiver_id = ?)"
        params += (other, other)
    return _transactions(ctx, where, params, (page_index, page_limit))


@app.api(read_only=True)
def show_transaction(
    ctx: Context, transaction_id: Annotated[int, Arg("The transaction to show.")]
) -> Transaction:
    """Show one transaction (yours, or a public one of a payment friend)."""
    _visible_transaction(ctx, transaction_id)
    return _transactions(ctx, "t.id = ?", (transaction_id,), (0, 1))[0]


@app.api(read_only=True)
def show_social_feed(
    ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list[Transaction]:
    """Show public transactions of your payment friends, newest first."""
    friends = "SELECT friend_id FROM payments_friends WHERE person_id = ?"
    where = f"t.is_private = 0 AND (t.sender_id IN ({friends}) OR t.receiver_id IN ({friends}))"
    return _transactions(ctx, where, (ctx.user_id, ctx.user_id), (page_index, page_limit))


@app.api(read_only=False)
def send_money(
    ctx: Context,
    receiver_email: Annotated[str, Arg("Email of the person to pay.")],
    amount: Amount,
    description: Annotated[str, Arg("What the payment is for.")],
) -> Created:
    """Send money from your balance to another user."""
    receiver = person_by_email(ctx, receiver_email)
    if receiver["id"] == ctx.user_id:
        raise AppError(422, "You cannot send money to yourself.")
    tid = _move_money(ctx, ctx.user_id, receiver["id"], amount, description)
    return {"message": "Money sent.", "id": tid}


@app.api(read_only=False)
def like_transaction(
    ctx: Context, transaction_id: Annotated[int, Arg("The transaction to like.")]
) -> Message:
    """Like a transaction."""
    _visible_transaction(ctx, transaction_id)
    liked = ctx.db.execute(
        "SELECT 1 FROM payments_likes WHERE transaction_id = ? AND person_id = ?",
        (transaction_id, ctx.user_id),
    ).fetchone()
    if liked:
        raise AppError(422, f"You already liked transaction {transaction_id}.")
    ctx.db.execute(
        "INSERT INTO payments_likes (transaction_id, person_id, created_at) VALUES (?, ?, ?)",
        (transaction_id, ctx.user_id, ctx.now_iso),
    )
    return {"message": "Transaction liked."}


@app.api(read_only=False)
def unlike_transaction(
    ctx: Context, transaction_id: Annotated[int, Arg("The transaction to unlike.")]
) -> Message:
    """Remove your like from a transaction."""
    cursor = ctx.db.execute(
        "DELETE FROM payments_likes WHERE transaction_id = ? AND person_id = ?",
        (transaction_id, ctx.user_id),
    )
    if cursor.rowcount == 0:
        raise AppError(422, f"You have not liked transaction {transaction_id}.")
    return {"message": "Like removed."}


def _requests(ctx: Context, side: str, status: str | None, page: tuple[int, int]) -> Any:
    sql = f"{_REQUEST} WHERE q.{side} = ? AND (? IS NULL OR q.status = ?)"
    sql += " ORDER BY q.created_at DESC, q.id DESC"
    return ctx.page(sql, (ctx.user_id, status, status), *page)


@app.api(read_only=True)
def show_sent_payment_requests(
    ctx: Context,
    status: RequestStatus = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[PaymentRequest]:
    """Show the payment requests you sent to others, newest first."""
    return _requests(ctx, "requester_id", status, (page_index, page_limit))


@app.api(read_only=True)
def show_received_payment_requests(
    ctx: Context,
    status: RequestStatus = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[PaymentRequest]:
    """Show the payment requests others sent you, newest first."""
    return _requests(ctx, "payer_id", status, (page_index, page_limit))


@app.api(read_only=False)
def create_payment_request(
    ctx: Context,
    user_email: Annotated[str, Arg("Email of the person who should pay you.")],
    amount: Amount,
    description: Annotated[str, Arg("What the request is for.")],
) -> Created:
    """Ask another user to pay you."""
    payer = person_by_email(ctx, user_email)
    if payer["id"] == ctx.user_id:
        raise AppError(422, "You cannot request money from yourself.")
    cursor = ctx.db.execute(
        "INSERT INTO payments_requests (requester_id, payer_id, amount, description, created_at, "
        "status) VALUES (?, ?, ?, ?, ?, 'pending')",
        (ctx.user_id, payer["id"], round(amount, 2), description, ctx.now_iso),
    )
    return {"message": "Payment request sent.", "id": int(cursor.lastrowid or 0)}


def _pending(ctx: Context, request_id: int, side: str) -> dict[str, Any]:
    request = ctx.one(
        f"SELECT * FROM payments_requests WHERE id = ? AND {side} = ?",
        (request_id, ctx.user_id),
        f"No payment request with payment_request_id {request_id} "
        f"{'sent by' if side == 'requester_id' else 'sent to'} you.",
    )
    if request["status"] != "pending":
        raise AppError(422, f"Payment request {request_id} is already {request['status']}.")
    return request


@app.api(read_only=False)
def remind_payment_request(
    ctx: Context, payment_request_id: Annotated[int, Arg("A pending request you sent.")]
) -> Message:
    """Remind the payer of a pending payment request you sent."""
    _pending(ctx, payment_request_id, "requester_id")
    ctx.db.execute(
        "UPDATE payments_requests SET reminded_at = ? WHERE id = ?",
        (ctx.now_iso, payment_request_id),
    )
    return {"message": "Reminder sent."}


@app.api(read_only=False)
def approve_payment_request(
    ctx: Context, payment_request_id: Annotated[int, Arg("A pending request sent to you.")]
) -> Message:
    """Pay a pending payment request sent to you, from your balance."""
    request = _pending(ctx, payment_request_id, "payer_id")
    _move_money(
        ctx, ctx.user_id, request["requester_id"], request["amount"], request["description"]
    )
    ctx.db.execute(
        "UPDATE payments_requests SET status = 'approved', resolved_at = ? WHERE id = ?",
        (ctx.now_iso, payment_request_id),
    )
    return {"message": "Payment request approved and paid."}


@app.api(read_only=False)
def decline_payment_request(
    ctx: Context, payment_request_id: Annotated[int, Arg("A pending request sent to you.")]
) -> Message:
    """Decline a pending payment request sent to you."""
    _pending(ctx, payment_request_id, "payer_id")
    ctx.db.execute(
        "UPDATE payments_requests SET status = 'declined', resolved_at = ? WHERE id = ?",
        (ctx.now_iso, payment_request_id),
    )
    return {"message": "Payment request declined."}
