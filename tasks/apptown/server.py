"""The AppTown request handler: validates a call, checks the login, runs it in a transaction.

`AppServer.call(app, api, kwargs)` is what the sandbox's `apis.<app>.<api>(**kwargs)` reaches
(through `AppTownEnv`). Each call is atomic: an API that fails half way leaves no trace. An API
declared read-only that changed a row is a bug of the world, raised as such (never the agent's),
so the declaration `ApiCall.read_only` records is held, not trusted.
Arguments are untrusted: values SQLite or the APIs cannot hold (integers past 64 bits, NaN,
lone surrogates, deep nesting) are a 422 here, never an internal error.

`InProcessApis(server)` is the same `apis` without a sandbox (plain `exec`, NOT isolated): for
the worked example, authoring scenarios and benchmarks (tasks/apptown/inprocess.py).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import Any

from sandbox.arguments import argument_problem
from tasks.apptown.api import AppError, Context
from tasks.apptown.apps import APPS


class AppServer:
    """Serves every app of one task instance, on that instance's private database."""

    def __init__(self, db: sqlite3.Connection, user_id: int, now: datetime):
        self.ctx = Context(db=db, user_id=user_id, now=now, apps=APPS)

    def read_only(self, app: str, api: str) -> bool:
        """Whether `app.api` is a read (False for an unknown one: its call fails anyway)."""
        spec = APPS[app].apis.get(api) if app in APPS else None
        return spec is not None and spec.read_only

    def call(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        """Run `app.api(**kwargs)` for the user; raise `AppError` for what the agent should see."""
        if app not in APPS:
            raise AppError(404, f"No app named {app!r}. The apps are {sorted(APPS)}.")
        spec = APPS[app].apis.get(api)
        if spec is None:
            raise AppError(
                404,
                f"No API named {api!r} in {app}; see "
                f"apis.api_docs.show_api_descriptions(app_name={app!r}).",
            )
        problem = argument_problem(kwargs)  # the bridge checks too; this path may have no bridge
        if problem is not None:
            raise AppError(422, f"Invalid arguments to {app}.{api}: {problem}")
        args = spec.bind(kwargs)
        if spec.needs_login and app not in self.ctx.logged_in:
            raise AppError(401, f"You are not logged in to {app}; call apis.{app}.login first.")
        db = self.ctx.db
        db.execute("BEGIN")
        changes = db.total_changes
        try:
            result = spec.fn(self.ctx, **args)
            if spec.read_only and db.total_changes != changes:
                raise RuntimeError(f"{app}.{api} is declared read-only but changed a row")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result


class ApiError(Exception):
    """What agent code sees for an API error (mirrors sandbox.ApiError)."""


class _App:
    def __init__(self, server: AppServer, name: str):
        self._server, self._name = server, name

    def __getattr__(self, api: str) -> Any:
        def call(**kwargs: Any) -> Any:
            try:
                result = self._server.call(self._name, api, json.loads(json.dumps(kwargs)))
            except AppError as e:
                raise ApiError(f"{e.status}: {e.message}") from None
            return json.loads(json.dumps(result))

        return call


class InProcessApis:
    """`apis.<app>.<api>(**kwargs)` backed directly by an `AppServer`."""

    def __init__(self, server: AppServer):
        self._server = server

    def __getattr__(self, app: str) -> _App:
        return _App(self._server, app)
