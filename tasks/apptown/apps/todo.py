"""`todo`: to-do lists with items that have due dates, priorities and completion."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message, PageIndex, PageLimit
from tasks.apptown.apps.common import add_login, as_bools

app = App("todo", "To-do lists: lists, items with due dates and priorities, completing items.")
add_login(app, "email")

ItemId = Annotated[int, Arg("The item's id.")]
DueDate = Annotated[str | None, Arg("Due date as YYYY-MM-DD.")]
Priority = Annotated[str, Arg("The item's priority.", choices=("low", "normal", "high"))]


class TodoList(TypedDict):
    list_id: int
    name: str
    num_items: int
    num_completed: int


class TodoItem(TypedDict):
    item_id: int
    list_id: int
    title: str
    notes: str
    due_date: str | None
    priority: str
    is_completed: bool
    completed_at: str | None


class Created(TypedDict):
    message: str
    id: int


_ITEM = """SELECT i.id AS item_id, i.list_id, i.title, i.notes, i.due_date, i.priority,
    i.is_completed, i.completed_at FROM todo_items i JOIN todo_lists l ON l.id = i.list_id"""


def _own_list(ctx: Context, list_id: int) -> None:
    ctx.one(
        "SELECT id FROM todo_lists WHERE id = ? AND owner_id = ?",
        (list_id, ctx.user_id),
        f"No to-do list with list_id {list_id}.",
    )


def _own_item(ctx: Context, item_id: int) -> dict[str, Any]:
    return ctx.one(
        f"{_ITEM} WHERE i.id = ? AND l.owner_id = ?",
        (item_id, ctx.user_id),
        f"No to-do item with item_id {item_id}.",
    )


def _check_date(value: str | None) -> None:
    if value is None:
        return
    try:
        date.fromisoformat(value)
    except ValueError:
        raise AppError(422, f"due_date must be YYYY-MM-DD, got {value!r}.") from None


@app.api(read_only=True)
def show_lists(
    ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list[TodoList]:
    """Show your to-do lists, sorted by name."""
    return ctx.page(
        "SELECT l.id AS list_id, l.name, (SELECT count(*) FROM todo_items i WHERE i.list_id = l.id)"
        " AS num_items, (SELECT count(*) FROM todo_items i WHERE i.list_id = l.id AND "
        "i.is_completed = 1) AS num_completed FROM todo_lists l WHERE l.owner_id = ? "
        "ORDER BY l.name, l.id",
        (ctx.user_id,),
        page_index,
        page_limit,
    )


@app.api(read_only=False)
def create_list(ctx: Context, name: Annotated[str, Arg("The list's name.")]) -> Created:
    """Create an empty to-do list."""
    if ctx.db.execute(
        "SELECT 1 FROM todo_lists WHERE owner_id = ? AND name = ? COLLATE NOCASE",
        (ctx.user_id, name),
    ).fetchone():
        raise AppError(422, f"You already have a list named {name!r}.")
    cursor = ctx.db.execute(
        "INSERT INTO todo_lists (owner_id, name, created_at) VALUES (?, ?, ?)",
        (ctx.user_id, name, ctx.now_iso),
    )
    return {"message": "List created.", "id": int(cursor.lastrowid or 0)}


@app.api(read_only=True)
def show_items(
    ctx: Context,
    list_id: Annotated[int, Arg("The list whose items to show.")],
    is_completed: Annotated[
        bool | None, Arg("Only completed (true) or open (false) items.")
    ] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[TodoItem]:
    """Show the items of one of your lists, by due date (items without one last)."""
    _own_list(ctx, list_id)
    sql = f"""{_ITEM} WHERE i.list_id = ? AND (? IS NULL OR i.is_completed = ?)
        ORDER BY i.due_date IS NULL, i.due_date, i.id"""
    rows = ctx.page(sql, (list_id, is_completed, is_completed), page_index, page_limit)
    return as_bools(rows, "is_completed")


@app.api(read_only=False)
def add_item(
    ctx: Context,
    list_id: Annotated[int, Arg("The list to add to.")],
    title: Annotated[str, Arg("What to do.")],
    due_date: DueDate = None,
    priority: Priority = "normal",
    notes: Annotated[str, Arg("Extra details.")] = "",
) -> Created:
    """Add an item to one of your lists."""
    _own_list(ctx, list_id)
    _check_date(due_date)
    if not title.strip():
        raise AppError(422, "title must not be empty.")
    cursor = ctx.db.execute(
        "INSERT INTO todo_items (list_id, title, notes, due_date, priority, is_completed, "
        "completed_at, created_at) VALUES (?, ?, ?, ?, ?, 0, NULL, ?)",
        (list_id, title, notes, due_date, priority, ctx.now_iso),
    )
    return {"message": "Item added.", "id": int(cursor.lastrowid or 0)}


@app.api(read_only=False)
def update_item(
    ctx: Context,
    item_id: ItemId,
    title: Annotated[str | None, Arg("New title.")] = None,
    due_date: DueDate = None,
    priority: Annotated[str | None, Arg("New priority.", choices=("low", "normal", "high"))] = None,
    notes: Annotated[str | None, Arg("New notes.")] = None,
) -> Message:
    """Change the given fields of an item; fields left out keep their value."""
    _own_item(ctx, item_id)
    _check_date(due_date)
    values = {
        k: v
        for k, v in {
            "title": title,
            "due_date": due_date,
            "priority": priority,
            "notes": notes,
        }.items()
        if v is not None
    }
    if not values:
        raise AppError(422, "Nothing to update: pass at least one field.")
    assignments = ", ".join(f"{k} = ?" for k in values)
    ctx.db.execute(f"UPDATE todo_items SET {assignments} WHERE id = ?", (*values.values(), item_id))
    return {"message": "Item updated."}


@app.api(read_only=False)
def complete_item(ctx: Context, item_id: ItemId) -> Message:
    """Mark an item as completed."""
    if _own_item(ctx, item_id)["is_completed"]:
        raise AppError(422, f"Item {item_id} is already completed.")
    ctx.db.execute(
        "UPDATE todo_items SET is_completed = 1, completed_at = ? WHERE id = ?",
        (ctx.now_iso, item_id),
    )
    return {"message": "Item completed."}


@app.api(read_only=False)
def delete_item(ctx: Context, item_id: ItemId) -> Message:
    """Delete an item."""
    _own_item(ctx, item_id)
    ctx.db.execute("DELETE FROM todo_items WHERE id = ?", (item_id,))
    return {"message": "Item deleted."}
