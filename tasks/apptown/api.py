"""How an AppTown API is defined once and becomes a validator, a dispatcher entry and its docs.

An API is a plain function `fn(ctx, **kwargs)` registered on its `App` with `@app.api()`. Its
signature is the whole definition:

- parameter types and defaults come from the annotations (`Annotated[int, Arg(...)]` adds the
  description and bounds), and are enforced on every call (422 with a message on mismatch);
- the description is the function's docstring;
- the success response schema is the return annotation (a TypedDict or a list of one);
- whether it only reads is declared where it is registered (`@app.api(read_only=...)`, no
  default), never guessed from its name, and the server holds a read to it (server.py).

Every argument, whatever its type, holds at most MAX_STRING_CHARS characters in all its strings:
an `Any` parameter (complete_task's answer) takes lists and objects, and the grader parses
what it is given, so nothing the agent sends may be unbounded.

`api_docs.show_api_doc` renders exactly these objects, so the documentation the agent reads is
never written twice and cannot drift from what the code accepts.
"""

from __future__ import annotations

import inspect
import sqlite3
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, TypedDict

# The largest page an agent may ask for, as in AppWorld: code that assumes one page fails.
MAX_PAGE_LIMIT = 20
# The most characters one argument may hold, in all its strings together (a plain string, or
# every string and object key of a list or object): far past any real value, short of SQLite's
# LIKE pattern limit, and small enough that parsing an answer costs milliseconds.
MAX_STRING_CHARS = 10_000


class AppError(Exception):
    """An error the agent should see: an HTTP-like status and a readable message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Arg:
    """Documentation and bounds of one API parameter (the metadata of `Annotated`)."""

    doc: str
    ge: float | None = None  # inclusive lower bound for numbers
    le: float | None = None  # inclusive upper bound for numbers
    choices: tuple[str, ...] | None = None  # allowed values for strings


class Message(TypedDict):
    """The response of an API that only confirms what it did."""

    message: str


PageIndex = Annotated[int, Arg("The page to return, counting from 0.", ge=0)]
PageLimit = Annotated[
    int, Arg(f"The number of results per page (at most {MAX_PAGE_LIMIT}).", ge=1, le=MAX_PAGE_LIMIT)
]


@dataclass
class Context:
    """What an API function sees: the task's database, who the user is, and the session.

    The session (which apps are logged in, the submitted answer) lives here, not in the database,
    so logging in or reading never counts as a change of state.
    """

    db: sqlite3.Connection  # row_factory is sqlite3.Row
    user_id: int  # the supervisor's person id
    now: datetime  # the world's fixed clock
    apps: Mapping[str, App]
    logged_in: set[str] = field(default_factory=set)
    completed: bool = False
    answer: Any = None

    @property
    def now_iso(self) -> str:
        return self.now.isoformat(timespec="seconds")

    # The row helpers return `Any` rows: each API's TypedDict return annotation is its schema.
    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Run a query and return its rows as dicts."""
        return [dict(r) for r in self.db.execute(sql, params)]

    def page(
        self, sql: str, params: tuple[Any, ...], page_index: int, page_limit: int
    ) -> list[Any]:
        """One page of an ordered query (`sql` must end with its ORDER BY)."""
        offset = min(page_index * page_limit, 2**63 - 1)  # past every row, within SQLite's int64
        return self.rows(f"{sql} LIMIT ? OFFSET ?", (*params, page_limit, offset))

    def one(self, sql: str, params: tuple[Any, ...], missing: str) -> Any:
        """The single row of a query, or a 404 carrying `missing`."""
        row = self.db.execute(sql, params).fetchone()
        if row is None:
            raise AppError(404, missing)
        return dict(row)


@dataclass(frozen=True)
class Param:
    """One parameter of an API, read from the function signature."""

    name: str
    type: Any
    arg: Arg
    required: bool
    default: Any

    def check(self, value: Any) -> str | None:
        """Return why `value` is not acceptable for this parameter, or None if it is."""
        if not matches_type(value, self.type):
            shown = repr(value) if len(repr(value)) <= 200 else f"{repr(value)[:200]}..."
            return f"must be {type_name(self.type)}, got {type(value).__name__} {shown}"
        chars = text_size(value)
        if chars > MAX_STRING_CHARS:
            where = "" if isinstance(value, str) else " in all its strings"
            return f"must be at most {MAX_STRING_CHARS} characters{where}, got {chars}"
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and self.arg.ge is not None and value < self.arg.ge:
            return f"must be >= {self.arg.ge:g}, got {value!r}"
        if number and self.arg.le is not None and value > self.arg.le:
            return f"must be <= {self.arg.le:g}, got {value!r}"
        if self.arg.choices is not None and value is not None and value not in self.arg.choices:
            return f"must be one of {list(self.arg.choices)}, got {value!r}"
        return None


@dataclass(frozen=True)
class Api:
    """One registered API: its function and everything read from the function's signature."""

    app: str
    name: str
    fn: Callable[..., Any]
    description: str
    params: tuple[Param, ...]
    returns: Any
    needs_login: bool
    read_only: bool  # declared: changes no app data (`ApiCall.read_only`; the server holds it)

    def bind(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Check `kwargs` against the parameters and fill defaults; raise 422 naming the problem."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise AppError(
                422,
                f"{self.app}.{self.name} got unexpected argument(s) {unknown}; "
                f"its parameters are {list(known) or 'none'}",
            )
        bound: dict[str, Any] = {}
        for p in self.params:
            if p.name not in kwargs:
                if p.required:
                    raise AppError(422, f"{self.app}.{self.name} is missing argument {p.name!r}")
                bound[p.name] = p.default
                continue
            problem = p.check(kwargs[p.name])
            if problem:
                raise AppError(422, f"Argument {p.name!r} of {self.app}.{self.name} {problem}")
            bound[p.name] = kwargs[p.name]
        return bound

    def doc(self) -> dict[str, Any]:
        """The documentation record `api_docs.show_api_doc` returns."""
        return {
            "app_name": self.app,
            "api_name": self.name,
            "description": self.description,
            "requires_login": self.needs_login,
            "parameters": [
                {
                    "name": p.name,
                    "type": type_name(p.type),
                    "required": p.required,
                    "description": p.arg.doc,
                    **({} if p.required else {"default": p.default}),
                    **_constraints(p.arg),
                }
                for p in self.params
            ],
            "response_schemas": {
                "success": schema_of(self.returns),
                "failure": {"message": "string"},
            },
        }


class App:
    """A named set of APIs; `@app.api()` registers a function as one of them."""

    def __init__(self, name: str, description: str):
        self.name = name
        self.description = description
        self.apis: dict[str, Api] = {}

    def api(
        self, *, read_only: bool, login: bool = True
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated `fn(ctx, ...)`. `read_only`: it changes no app data (every
        API declares it; a session's login and logout are reads); `login=False` for APIs
        callable before login."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            assert fn.__name__ not in self.apis, f"{self.name}.{fn.__name__} defined twice"
            self.apis[fn.__name__] = _api_from_function(self.name, fn, login, read_only)
            return fn

        return register


def _api_from_function(app: str, fn: Callable[..., Any], login: bool, read_only: bool) -> Api:
    hints = typing.get_type_hints(fn, include_extras=True)
    signature = inspect.signature(fn)
    params = []
    for name, sp in list(signature.parameters.items())[1:]:  # the first one is ctx
        hint = hints[name]
        assert typing.get_origin(hint) is Annotated, f"{app}.{fn.__name__}({name}) lacks an Arg"
        base, arg = typing.get_args(hint)[:2]
        required = sp.default is inspect.Parameter.empty
        params.append(Param(name, base, arg, required, None if required else sp.default))
    assert fn.__doc__, f"{app}.{fn.__name__} has no docstring (it is the API's description)"
    return Api(
        app=app,
        name=fn.__name__,
        fn=fn,
        description=inspect.cleandoc(fn.__doc__),
        params=tuple(params),
        returns=hints["return"],
        needs_login=login,
        read_only=read_only,
    )


def text_size(value: Any) -> int:
    """The characters of every string and object key in a JSON value, together (iterative: a
    deep value cannot make it recurse; the bridge bounds the number of members)."""
    size, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            size += sum(len(key) for key in item if isinstance(key, str))
            stack.extend(item.values())
    return size


def matches_type(value: Any, tp: Any) -> bool:
    """Whether a JSON-decoded `value` fits the annotation `tp` (bool is not an int here)."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return any(matches_type(value, t) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(matches_type(v, item) for v in value)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is Any:
        return True
    return isinstance(value, tp)


_JSON_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}


def type_name(tp: Any) -> str:
    """A JSON-flavoured name for an annotation: `list[string]`, `integer | null`."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(type_name(t) for t in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "object"
    return _JSON_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def schema_of(tp: Any) -> Any:
    """The response schema of a return annotation: TypedDicts become field -> type maps."""
    if typing.is_typeddict(tp):
        return {k: schema_of(v) for k, v in typing.get_type_hints(tp).items()}
    if typing.get_origin(tp) is list:
        return [schema_of(typing.get_args(tp)[0])]
    return type_name(tp)


def _constraints(arg: Arg) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if arg.ge is not None:
        out["minimum"] = arg.ge
    if arg.le is not None:
        out["maximum"] = arg.le
    if arg.choices is not None:
        out["choices"] = list(arg.choices)
    return out
