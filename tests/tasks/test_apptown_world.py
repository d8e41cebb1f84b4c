"""The AppTown world and its apps: determinism, fast forks, logins, errors, pagination, docs.

Run: python -m pytest tests/tasks/test_apptown_world.py -q
"""

from __future__ import annotations

import time
import types
import typing
from typing import Any

import pytest

from tasks.apptown.api import MAX_PAGE_LIMIT, App, AppError, Context, Message
from tasks.apptown.apps import APPS
from tasks.apptown.people import RELATIONSHIPS
from tasks.apptown.server import AppServer
from tasks.apptown.world import USER_APPS, World


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(seed=0)


def _server(world: World, user_id: int = 5, login: tuple[str, ...] = USER_APPS) -> AppServer:
    server = AppServer(world.template.fork(), user_id, world.now)
    person = world.person(user_id)
    passwords = {
        a["account_name"]: a["password"]
        for a in server.call("supervisor", "show_account_passwords", {})
    }
    for app in login:
        username = person.phone_number if app == "phone" else person.email
        server.call(app, "login", {"username": username, "password": passwords[app]})
    return server


def _error(server: AppServer, app: str, api: str, kwargs: dict[str, Any]) -> AppError:
    with pytest.raises(AppError) as info:
        server.call(app, api, kwargs)
    return info.value


def test_same_seed_same_world_and_different_seed_different_world(world: World) -> None:
    again = World.build(seed=0)
    assert world.template.fork().serialize() == again.template.fork().serialize()
    assert World.build(seed=1).template.fork().serialize() != again.template.fork().serialize()


def test_society_is_big_enough_and_uses_every_relationship(world: World) -> None:
    people = world.society.people
    assert len(people) >= 60
    assert len({p.email for p in people}) == len({p.phone_number for p in people}) == len(people)
    labels = {label for labels in world.society.relations.values() for label in labels}
    assert labels == set(RELATIONSHIPS)
    for app_table in (
        "phone_contacts",
        "payments_transactions",
        "music_library",
        "email_recipients",
        "files_files",
        "todo_lists",
    ):
        owner = (
            "owner_id"
            if app_table in ("phone_contacts", "files_files", "todo_lists")
            else ("sender_id" if app_table == "payments_transactions" else "person_id")
        )
        with_data = world.template.rows(f"SELECT DISTINCT {owner} AS p FROM {app_table}")
        assert len(with_data) == len(people), f"someone has no data in {app_table}"


def test_fork_is_byte_identical_private_and_fast(world: World) -> None:
    first, second = world.template.fork(), world.template.fork()
    assert first.serialize() == second.serialize()
    first.execute("DELETE FROM phone_contacts")
    assert second.execute("SELECT count(*) FROM phone_contacts").fetchone()[0] > 0
    times = []
    for _ in range(20):
        start = time.perf_counter()
        world.template.fork()
        times.append(time.perf_counter() - start)
    assert sorted(times)[10] < 0.005, f"median fork took {sorted(times)[10] * 1e3:.2f} ms"


def test_six_user_apps_plus_supervisor_and_api_docs() -> None:
    assert set(USER_APPS) <= set(APPS) and len(USER_APPS) >= 6
    assert {"supervisor", "api_docs"} <= set(APPS)
    for app in USER_APPS:
        assert "login" in APPS[app].apis, app


def test_login_needs_the_supervisors_password(world: World) -> None:
    server = _server(world, login=())
    error = _error(server, "phone", "search_contacts", {})
    assert (error.status, error.message) == (
        401,
        "You are not logged in to phone; call apis.phone.login first.",
    )
    person = world.person(5)
    error = _error(
        server, "phone", "login", {"username": person.phone_number, "password": "dummy_pass"}
    )
    assert error.status == 401 and "Invalid username or password" in error.message


def test_bad_arguments_are_422_with_a_message(world: World) -> None:
    server = _server(world)
    unknown = _error(server, "phone", "search_contacts", {"name": "x"})
    assert unknown.status == 422 and "unexpected argument(s) ['name']" in unknown.message
    too_big = _error(server, "phone", "search_contacts", {"page_limit": MAX_PAGE_LIMIT + 1})
    assert too_big.status == 422 and f"must be <= {MAX_PAGE_LIMIT}" in too_big.message
    wrong_type = _error(server, "music", "like_song", {"song_id": "7"})
    assert wrong_type.status == 422 and "must be integer" in wrong_type.message
    missing = _error(server, "payments", "send_money", {"amount": 5.0})
    assert missing.status == 422 and "missing argument 'receiver_email'" in missing.message
    choice = _error(server, "phone", "search_contacts", {"relationship": "cousin"})
    assert choice.status == 422 and "must be one of" in choice.message


def test_unknown_ids_apps_and_apis_are_404(world: World) -> None:
    server = _server(world)
    assert _error(server, "music", "show_song", {"song_id": 10**6}).status == 404
    assert _error(server, "phone", "show_contact", {"contact_id": 1}).status == 404  # not yours
    assert _error(server, "venmo", "login", {}).status == 404
    assert "show_api_descriptions" in _error(server, "phone", "fly", {}).message


def test_pagination_returns_disjoint_pages_that_cover_everything(world: World) -> None:
    server = _server(world)
    everything = server.call("phone", "search_contacts", {"page_limit": MAX_PAGE_LIMIT})
    assert len(server.call("phone", "search_contacts", {})) == 5  # the default page
    pages, index = [], 0
    while batch := server.call("phone", "search_contacts", {"page_index": index, "page_limit": 3}):
        pages += batch
        index += 1
    assert [c["contact_id"] for c in pages][: len(everything)] == [
        c["contact_id"] for c in everything
    ]
    assert len({c["contact_id"] for c in pages}) == len(pages)


def test_a_failing_call_leaves_no_trace(world: World) -> None:
    server = _server(world)
    before = server.ctx.db.serialize()
    error = _error(
        server,
        "payments",
        "send_money",
        {"receiver_email": world.person(6).email, "amount": 9999.0, "description": "x"},
    )
    assert error.status == 422 and "Insufficient balance" in error.message
    assert server.ctx.db.serialize() == before


def test_reads_change_nothing(world: World) -> None:
    server = _server(world)
    before = server.ctx.db.serialize()
    for app, api in (
        ("phone", "show_text_messages"),
        ("payments", "show_social_feed"),
        ("music", "show_playlists"),
        ("email", "show_inbox"),
        ("files", "list_directory"),
        ("todo", "show_lists"),
    ):
        server.call(app, api, {})
    assert server.ctx.db.serialize() == before


def test_api_docs_are_generated_from_the_definitions(world: World) -> None:
    server = _server(world, login=())
    apps = server.call("api_docs", "show_app_descriptions", {})
    assert [a["name"] for a in apps] == list(APPS)
    for name, app in APPS.items():
        listed = server.call("api_docs", "show_api_descriptions", {"app_name": name})
        assert [a["name"] for a in listed] == list(app.apis)
        for api in app.apis.values():
            doc = server.call("api_docs", "show_api_doc", {"app_name": name, "api_name": api.name})
            assert doc["description"] and doc["response_schemas"]["success"]
            assert [p["name"] for p in doc["parameters"]] == [p.name for p in api.params]
    doc = server.call(
        "api_docs", "show_api_doc", {"app_name": "phone", "api_name": "search_contacts"}
    )
    limit = next(p for p in doc["parameters"] if p["name"] == "page_limit")
    assert (limit["type"], limit["default"], limit["maximum"]) == ("integer", 5, MAX_PAGE_LIMIT)
    assert doc["response_schemas"]["success"][0]["relationships"] == ["string"]


@pytest.mark.parametrize(
    ("app", "api", "kwargs"),
    [
        ("music", "show_song", {"song_id": 2**70}),
        ("payments", "send_money", {"receiver_email": "x@y.z", "amount": float("nan"),
                                    "description": "nan"}),
        ("phone", "search_contacts", {"query": "\ud800"}),
        ("supervisor", "show_profile", {"extra": [[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]}),
    ],
    ids=["int-2**70", "nan-amount", "lone-surrogate", "deep-nesting"],
)  # fmt: skip
def test_extreme_arguments_are_422_never_an_internal_error(
    world: World, app: str, api: str, kwargs: dict[str, Any]
) -> None:
    error = _error(_server(world), app, api, kwargs)
    assert error.status == 422 and "Invalid arguments" in error.message, error


def test_a_page_past_sqlites_range_is_empty_not_an_error(world: World) -> None:
    assert _server(world).call("music", "show_playlists", {"page_index": 10**18}) == []


def test_a_string_too_long_for_sqlite_is_422(world: World) -> None:
    error = _error(_server(world), "phone", "search_contacts", {"query": "x" * 900_000})
    assert error.status == 422 and "at most 10000 characters" in error.message


@pytest.mark.parametrize(
    "answer",
    [["1" * 45_000 + "x"], ["x" * 5_000, "y" * 5_001], {"k" * 10_001: 1}, [["x" * 10_001]]],
    ids=["one-item", "items-together", "object-key", "nested"],
)
def test_an_answer_of_any_type_is_bounded_in_size(world: World, answer: Any) -> None:
    """A list or an object skipped the limit of strings, and the grader parses the answer."""
    server = _server(world, login=())
    error = _error(server, "supervisor", "complete_task", {"answer": answer})
    assert error.status == 422 and "at most 10000 characters in all its strings" in error.message
    assert not server.ctx.completed  # refused: the agent can answer again
    server.call("supervisor", "complete_task", {"answer": ["x" * 5_000, "y" * 5_000]})
    assert server.ctx.completed


def test_every_api_declares_whether_it_only_reads() -> None:
    """Declared where each API is registered, not guessed from its name."""
    reads = {f"{a.name}.{s.name}" for a in APPS.values() for s in a.apis.values() if s.read_only}
    assert {"files.list_directory", "phone.login", "music.logout", "api_docs.show_api_doc"} <= reads
    assert not reads & {"email.download_attachment", "supervisor.complete_task", "music.like_song"}
    with pytest.raises(TypeError, match="read_only"):
        App("x", "x").api()  # type: ignore[call-arg]


def test_a_read_only_api_that_writes_is_a_bug_of_the_world(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = App("sneaky", "Declares a read that writes.")

    @app.api(read_only=True, login=False)
    def show_nothing(ctx: Context) -> Message:
        """Claims to read."""
        ctx.db.execute("UPDATE todo_items SET title = 'x' WHERE id = 1")
        return {"message": "read"}

    monkeypatch.setitem(APPS, "sneaky", app)
    server = _server(world, login=())
    before = server.ctx.db.serialize()
    with pytest.raises(RuntimeError, match="declared read-only but changed a row"):
        server.call("sneaky", "show_nothing", {})
    assert server.ctx.db.serialize() == before  # rolled back


def _extremes(tp: Any) -> list[Any]:
    """Type-valid values at the edges of what JSON, Python and SQLite hold."""
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        return [v for t in typing.get_args(tp) for v in _extremes(t)]
    if typing.get_origin(tp) is list:
        return [[], _extremes(typing.get_args(tp)[0])[:3]]
    return {
        int: [0, -1, 2**63 - 1, -(2**63), 10**12],
        float: [0.0, 1e308, -1e308, 1e-300],
        str: ["", "x" * 10_000, "%", "'", "\x00", "2024-99-99", "9999-12-31T23:59:59"],
        bool: [True, False],
    }.get(tp, [None, 1, "x", [1], {"a": 1}])


def test_no_api_fails_internally_on_extreme_valid_arguments(world: World) -> None:
    failures = []
    for app in APPS.values():
        for spec in app.apis.values():
            for param in spec.params:
                for value in _extremes(param.type):
                    kwargs = {p.name: _extremes(p.type)[0] for p in spec.params if p.required}
                    try:
                        _server(world).call(app.name, spec.name, {**kwargs, param.name: value})
                    except AppError:
                        pass  # an error the agent reads: its own
                    except Exception as exc:
                        call = f"{app.name}.{spec.name}({param.name}={value!r:.30})"
                        failures.append(f"{call}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)
