"""`music`: a Spotify-like app: the song catalog, your library, liked songs and playlists."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from tasks.apptown.api import App, AppError, Arg, Context, Message, PageIndex, PageLimit
from tasks.apptown.apps.common import add_login, as_bools, like_pattern
from tasks.apptown.content import GENRES

app = App(
    "music",
    "Stream music: search songs and albums, your library, liked songs and playlists.",
)
add_login(app, "email")

SongId = Annotated[int, Arg("The song's id.")]
PlaylistId = Annotated[int, Arg("The playlist's id.")]


class Song(TypedDict):
    song_id: int
    title: str
    artist: str
    album_id: int
    album_title: str
    genre: str
    duration_s: int
    release_year: int
    play_count: int


class Album(TypedDict):
    album_id: int
    title: str
    artist: str
    genre: str
    release_year: int
    song_ids: list[int]


class PlaylistSummary(TypedDict):
    playlist_id: int
    title: str
    is_public: bool
    num_songs: int
    created_at: str


class Playlist(TypedDict):
    playlist_id: int
    title: str
    is_public: bool
    created_at: str
    songs: list[Song]


class Created(TypedDict):
    message: str
    id: int


_SONG = """SELECT s.id AS song_id, s.title, s.artist, s.album_id, a.title AS album_title,
    s.genre, s.duration_s, s.release_year, s.play_count
    FROM music_songs s JOIN music_albums a ON a.id = s.album_id"""

_PLAYLIST = """SELECT p.id AS playlist_id, p.title, p.is_public, p.created_at,
    (SELECT count(*) FROM music_playlist_songs x WHERE x.playlist_id = p.id) AS num_songs
    FROM music_playlists p"""


def _song(ctx: Context, song_id: int) -> Any:
    return ctx.one(f"{_SONG} WHERE s.id = ?", (song_id,), f"No song with song_id {song_id}.")


def _own_playlist(ctx: Context, playlist_id: int) -> Any:
    playlist = ctx.one(
        f"{_PLAYLIST} WHERE p.id = ? AND p.owner_id = ?",
        (playlist_id, ctx.user_id),
        f"No playlist with playlist_id {playlist_id} in your account.",
    )
    return as_bools([playlist], "is_public")[0]


def _collection(ctx: Context, table: str, page: tuple[int, int]) -> Any:
    sql = f"""{_SONG} JOIN {table} c ON c.song_id = s.id WHERE c.person_id = ?
        ORDER BY s.title, s.id"""
    return ctx.page(sql, (ctx.user_id,), *page)


def _toggle(ctx: Context, table: str, song_id: int, add: bool, what: str) -> Message:
    title = _song(ctx, song_id)["title"]
    present = ctx.db.execute(
        f"SELECT id FROM {table} WHERE person_id = ? AND song_id = ?", (ctx.user_id, song_id)
    ).fetchone()
    if add and present:
        raise AppError(422, f"Song {song_id} ({title}) is already in your {what}.")
    if not add and not present:
        raise AppError(422, f"Song {song_id} ({title}) is not in your {what}.")
    column = "added_at" if table == "music_library" else "created_at"
    if add:
        ctx.db.execute(
            f"INSERT INTO {table} (person_id, song_id, {column}) VALUES (?, ?, ?)",
            (ctx.user_id, song_id, ctx.now_iso),
        )
    else:
        ctx.db.execute(f"DELETE FROM {table} WHERE id = ?", (present["id"],))
    return {
        "message": f"{'Added' if add else 'Removed'} {title!r} "
        f"{'to' if add else 'from'} your {what}."
    }


@app.api(read_only=True)
def search_songs(
    ctx: Context,
    query: Annotated[str, Arg("Text to find in the title, artist or album.")] = "",
    artist: Annotated[str | None, Arg("Only songs by this artist (exact name).")] = None,
    genre: Annotated[str | None, Arg("Only songs of this genre.", choices=GENRES)] = None,
    page_index: PageIndex = 0,
    page_limit: PageLimit = 5,
) -> list[Song]:
    """Search the song catalog, sorted by title."""
    sql = f"""{_SONG} WHERE (s.title || ' ' || s.artist || ' ' || a.title) LIKE ? ESCAPE '\\'
        AND (? IS NULL OR s.artist = ? COLLATE NOCASE) AND (? IS NULL OR s.genre = ?)
        ORDER BY s.title, s.id"""
    params = (like_pattern(query), artist, artist, genre, genre)
    return ctx.page(sql, params, page_index, page_limit)


@app.api(read_only=True)
def show_song(ctx: Context, song_id: SongId) -> Song:
    """Show one song."""
    return _song(ctx, song_id)


@app.api(read_only=True)
def show_album(ctx: Context, album_id: Annotated[int, Arg("The album's id.")]) -> Album:
    """Show an album with the ids of its songs."""
    album = ctx.one(
        "SELECT id AS album_id, title, artist, genre, release_year FROM music_albums WHERE id = ?",
        (album_id,),
        f"No album with album_id {album_id}.",
    )
    songs = ctx.db.execute("SELECT id FROM music_songs WHERE album_id = ? ORDER BY id", (album_id,))
    album["song_ids"] = [r["id"] for r in songs]
    return album


@app.api(read_only=True)
def show_library(ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5) -> list[Song]:
    """Show the songs in your library, sorted by title."""
    return _collection(ctx, "music_library", (page_index, page_limit))


@app.api(read_only=False)
def add_song_to_library(ctx: Context, song_id: SongId) -> Message:
    """Add a song to your library."""
    return _toggle(ctx, "music_library", song_id, True, "library")


@app.api(read_only=False)
def remove_song_from_library(ctx: Context, song_id: SongId) -> Message:
    """Remove a song from your library."""
    return _toggle(ctx, "music_library", song_id, False, "library")


@app.api(read_only=True)
def show_liked_songs(
    ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list[Song]:
    """Show the songs you liked, sorted by title (liked songs need not be in your library)."""
    return _collection(ctx, "music_likes", (page_index, page_limit))


@app.api(read_only=False)
def like_song(ctx: Context, song_id: SongId) -> Message:
    """Like a song."""
    return _toggle(ctx, "music_likes", song_id, True, "liked songs")


@app.api(read_only=False)
def unlike_song(ctx: Context, song_id: SongId) -> Message:
    """Remove a song from your liked songs."""
    return _toggle(ctx, "music_likes", song_id, False, "liked songs")


@app.api(read_only=True)
def show_playlists(
    ctx: Context, page_index: PageIndex = 0, page_limit: PageLimit = 5
) -> list[PlaylistSummary]:
    """Show your playlists, oldest first."""
    rows = ctx.page(
        f"{_PLAYLIST} WHERE p.owner_id = ? ORDER BY p.created_at, p.id",
        (ctx.user_id,),
        page_index,
        page_limit,
    )
    return as_bools(rows, "is_public")


@app.api(read_only=True)
def show_playlist(ctx: Context, playlist_id: PlaylistId) -> Playlist:
    """Show one of your playlists with all its songs, in playlist order."""
    playlist = _own_playlist(ctx, playlist_id)
    del playlist["num_songs"]
    playlist["songs"] = ctx.rows(
        f"""{_SONG} JOIN music_playlist_songs x ON x.song_id = s.id
        WHERE x.playlist_id = ? ORDER BY x.position, x.id""",
        (playlist_id,),
    )
    return playlist


@app.api(read_only=False)
def create_playlist(
    ctx: Context,
    title: Annotated[str, Arg("The playlist's title.")],
    is_public: Annotated[bool, Arg("Whether others can see it.")] = False,
) -> Created:
    """Create an empty playlist."""
    if not title.strip():
        raise AppError(422, "title must not be empty.")
    cursor = ctx.db.execute(
        "INSERT INTO music_playlists (owner_id, title, is_public, created_at) VALUES (?, ?, ?, ?)",
        (ctx.user_id, title, int(is_public), ctx.now_iso),
    )
    return {"message": "Playlist created.", "id": int(cursor.lastrowid or 0)}


@app.api(read_only=False)
def add_song_to_playlist(ctx: Context, playlist_id: PlaylistId, song_id: SongId) -> Message:
    """Append a song to one of your playlists."""
    _own_playlist(ctx, playlist_id)
    title = _song(ctx, song_id)["title"]
    if ctx.db.execute(
        "SELECT 1 FROM music_playlist_songs WHERE playlist_id = ? AND song_id = ?",
        (playlist_id, song_id),
    ).fetchone():
        raise AppError(422, f"Song {song_id} ({title}) is already in playlist {playlist_id}.")
    ctx.db.execute(
        "INSERT INTO music_playlist_songs (playlist_id, song_id, position) VALUES "
        "(?, ?, (SELECT coalesce(max(position), -1) + 1 FROM music_playlist_songs "
        "WHERE playlist_id = ?))",
        (playlist_id, song_id, playlist_id),
    )
    return {"message": f"Added {title!r} to the playlist."}


@app.api(read_only=False)
def remove_song_from_playlist(ctx: Context, playlist_id: PlaylistId, song_id: SongId) -> Message:
    """Remove a song from one of your playlists."""
    _own_playlist(ctx, playlist_id)
    cursor = ctx.db.execute(
        "DELETE FROM music_playlist_songs WHERE playlist_id = ? AND song_id = ?",
        (playlist_id, song_id),
    )
    if cursor.rowcount == 0:
        raise AppError(422, f"Song {song_id} is not in playlist {playlist_id}.")
    return {"message": "Song removed from the playlist."}


@app.api(read_only=False)
def delete_playlist(ctx: Context, playlist_id: PlaylistId) -> Message:
    """Delete one of your playlists."""
    _own_playlist(ctx, playlist_id)
    ctx.db.execute("DELETE FROM music_playlist_songs WHERE playlist_id = ?", (playlist_id,))
    ctx.db.execute("DELETE FROM music_playlists WHERE id = ?", (playlist_id,))
    return {"message": "Playlist deleted."}
