"""`files`: your files, addressed by absolute path like `/documents/budget.txt`."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message, PageIndex, PageLimit
from tasks.apptown.apps.common import add_login

app = App("files", "Your files and directories: list, read, create, update, move, delete.")
add_login(app, "email")

Path = Annotated[str, Arg("An absolute file path, e.g. /documents/notes.txt.")]


class FileInfo(TypedDict):
    path: str
    size: int
    updated_at: str


class File(TypedDict):
    path: str
    content: str
    created_at: str
    updated_at: str


def _valid(path: str) -> str:
    if not path.startswith("/") or path.endswith("/") or "//" in path:
        raise AppError(422, f"{path!r} is not an absolute file path like /documents/notes.txt.")
    return path


def _file(ctx: Context, path: str) -> Any:
    return ctx.one(
        "SELECT id, path, content, created_at, updated_at FROM files_files WHERE "
        "owner_id = ? AND path = ?",
        (ctx.user_id, _valid(path)),
        f"No file at {path!r}.",
    )


def _free(ctx: Context, path: str) -> None:
    if ctx.db.execute(
        "SELECT 1 FROM files_files WHERE owner_id = ? AND path = ?", (ctx.user_id, _valid(path))
    ).fetchone():
        raise AppError(422, f"A file already exists at {path!r}.")


@app.api(read_only=True)
def list_directory(
    ctx: Context,
    directory: Annotated[str, Arg("The directory to list, recursively.")] = "/",
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[FileInfo]:
    """List the files under a directory (and its subdirectories), sorted by path."""
    prefix = directory if directory.endswith("/") else f"{directory}/"
    if not prefix.startswith("/"):
        raise AppError(422, f"directory must be absolute, got {directory!r}.")
    return ctx.page(
        "SELECT path, length(content) AS size, updated_at FROM files_files WHERE "
        "owner_id = ? AND substr(path, 1, ?) = ? ORDER BY path",
        (ctx.user_id, len(prefix), prefix),
        page_index,
        page_limit,
    )


@app.api(read_only=True)
def show_file(ctx: Context, path: Path) -> File:
    """Show a file's content."""
    f = _file(ctx, path)
    del f["id"]
    return f


@app.api(read_only=False)
def create_file(
    ctx: Context, path: Path, content: Annotated[str, Arg("The file's text.")] = ""
) -> Message:
    """Create a new file (directories are implicit)."""
    _free(ctx, path)
    ctx.db.execute(
        "INSERT INTO files_files (owner_id, path, content, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (ctx.user_id, path, content, ctx.now_iso, ctx.now_iso),
    )
    return {"message": f"Created {path}."}


@app.api(read_only=False)
def update_file(
    ctx: Context, path: Path, content: Annotated[str, Arg("The new text (replaces the old).")]
) -> Message:
    """Replace a file's content."""
    f = _file(ctx, path)
    ctx.db.execute(
        "UPDATE files_files SET content = ?, updated_at = ? WHERE id = ?",
        (content, ctx.now_iso, f["id"]),
    )
    return {"message": f"Updated {path}."}


@app.api(read_only=False)
def move_file(
    ctx: Context,
    source_path: Annotated[str, Arg("The file to move.")],
    destination_path: Annotated[str, Arg("Its new path.")],
) -> Message:
    """Move or rename a file."""
    f = _file(ctx, source_path)
    _free(ctx, destination_path)
    ctx.db.execute(
        "UPDATE files_files SET path = ?, updated_at = ? WHERE id = ?",
        (destination_path, ctx.now_iso, f["id"]),
    )
    return {"message": f"Moved {source_path} to {destination_path}."}


@app.api(read_only=False)
def delete_file(ctx: Context, path: Path) -> Message:
    """Delete a file."""
    f = _file(ctx, path)
    ctx.db.execute("DELETE FROM files_files WHERE id = ?", (f["id"],))
    return {"message": f"Deleted {path}."}
