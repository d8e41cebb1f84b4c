"""Every AppTown app, by name: six user apps plus `supervisor` and `api_docs`."""

from __future__ import annotations

from tasks.apptown.api import App
from tasks.apptown.apps import api_docs, email, files, music, payments, phone, supervisor, todo

APPS: dict[str, App] = {
    a.name: a
    for a in (
        api_docs.app,
        supervisor.app,
        phone.app,
        payments.app,
        music.app,
        email.app,
        files.app,
        todo.app,
    )
}
