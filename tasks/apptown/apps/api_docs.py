"""`api_docs`: the documentation of every app, rendered from the API definitions themselves."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from tasks.apptown.api import Api, App, AppError, Arg, Context

app = App(
    "api_docs",
    "Documentation of every app: list the apps, list an app's APIs, read one API's full doc.",
)


class AppDescription(TypedDict):
    name: str
    description: str


class ApiDescription(TypedDict):
    name: str
    description: str


def _app(ctx: Context, app_name: str) -> App:
    if app_name not in ctx.apps:
        raise AppError(404, f"No app named {app_name!r}. The apps are {sorted(ctx.apps)}.")
    return ctx.apps[app_name]


def _summary(api: Api) -> str:
    return api.description.split("\n\n")[0].replace("\n", " ")


@app.api(read_only=True, login=False)
def show_app_descriptions(ctx: Context) -> list[AppDescription]:
    """List every app with a one-line description."""
    return [{"name": a.name, "description": a.description} for a in ctx.apps.values()]


@app.api(read_only=True, login=False)
def show_api_descriptions(
    ctx: Context, app_name: Annotated[str, Arg("The app whose APIs to list.")]
) -> list[ApiDescription]:
    """List the APIs of one app with a short description of each."""
    return [{"name": a.name, "description": _summary(a)} for a in _app(ctx, app_name).apis.values()]


@app.api(read_only=True, login=False)
def show_api_doc(
    ctx: Context,
    app_name: Annotated[str, Arg("The app the API belongs to.")],
    api_name: Annotated[str, Arg("The API to document.")],
) -> dict[str, Any]:
    """Show the full documentation of one API: description, parameters with types, defaults and
    limits, and the schema of its response."""
    apis = _app(ctx, app_name).apis
    if api_name not in apis:
        raise AppError(404, f"No API named {api_name!r} in {app_name}. Its APIs are {list(apis)}.")
    return apis[api_name].doc()
