"""Start-up code run inside every kernel: defines `apis` and `ApiError`, and nothing else.

This file is not imported by the host. The sandbox copies its text into the kernel's channel
directory with the bridge socket path filled in, and ipykernel runs it at start-up (exec_files).
It may use only the standard library: the kernel cannot import our packages.

`apis.<app>.<api>(**kwargs)` sends one JSON line to the host and returns the decoded result or
raises `ApiError`. Output and error text are capped here, where they are produced
(`_loop_cap_output`, `_loop_cap_errors`), so that a well-meant cell's long output or huge
exception message arrives cut, with a notice. Agent code can undo this layer; the host's limits
(`sandbox/channel.py`) do not depend on it. Frames of this file carry `__tracebackhide__`, so
tracebacks the agent reads start and end in its own code.
"""

BRIDGE_SOCKET = "__BRIDGE_SOCKET__"  # replaced by the host when it writes this file
MAX_REQUEST_BYTES = 1 << 20  # replaced too: the bridge server's own limit
MAX_OUTPUT_CHARS = 20_000  # replaced as well: what the host shows of one cell
DROPPED_MIME = "application/x-loop-dropped"  # the host reads the dropped count from this
HOST_LIFELINE_FD = -1  # replaced last: a pipe only the host writes to (end-of-file: it is gone)


def _loop_watch_host(fd):  # type: ignore[no-untyped-def]
    """End this kernel when the host process is gone, however it died (its pipe reads EOF)."""
    import os
    import threading

    def watch():
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os._exit(0)

    if fd >= 0:
        threading.Thread(target=watch, name="loop-host-lifeline", daemon=True).start()


def _loop_make_apis(socket_path, max_request_bytes):  # type: ignore[no-untyped-def]
    import json
    import socket
    import threading

    class ApiError(Exception):
        """An error returned by an app's API (str: "<status>: <message>")."""

        def __init__(self, message, status=None):
            super().__init__(message if status is None else f"{status}: {message}")
            self.message = message
            self.status = status

    class _Channel:
        def __init__(self):
            self._sock = None
            self._reader = None
            self._next_id = 0
            self._lock = threading.Lock()

        def call(self, app, api, kwargs):
            __tracebackhide__ = True
            with self._lock:
                self._next_id += 1
                request = {"id": self._next_id, "app": app, "api": api, "kwargs": kwargs}
                try:
                    line = json.dumps(request)
                except (TypeError, ValueError) as exc:
                    message = f"apis.{app}.{api}: arguments must be JSON values ({exc})"
                    raise TypeError(message) from None
                data = line.encode() + b"\n"
                if len(data) > max_request_bytes:
                    message = f"apis.{app}.{api}: request of {len(data)} bytes is too large "
                    raise ValueError(message + f"(limit {max_request_bytes})") from None
                try:
                    if self._sock is None:
                        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        self._sock.connect(socket_path)
                        self._reader = self._sock.makefile("rb")
                    self._sock.sendall(data)
                    raw = self._reader.readline()
                except BaseException:
                    self._close()  # an interrupted call leaves the stream mid-message
                    raise
                if not raw:
                    self._close()
                    raise ConnectionError("the API server closed the connection") from None
            reply = json.loads(raw)
            if reply.get("ok"):
                return reply.get("result")
            raise ApiError(reply.get("error", "unknown error"), reply.get("status"))

        def _close(self):
            if self._sock is not None:
                self._sock.close()
            self._sock = self._reader = None

    class _Api:
        __slots__ = ("_api", "_app", "_channel")

        def __init__(self, channel, app, api):
            self._channel, self._app, self._api = channel, app, api

        def __call__(self, *args, **kwargs):
            __tracebackhide__ = True
            if args:
                raise TypeError(
                    f"apis.{self._app}.{self._api} takes keyword arguments only, "
                    f"e.g. apis.{self._app}.{self._api}(name=value)"
                ) from None
            return self._channel.call(self._app, self._api, kwargs)

        def __repr__(self):
            return f"<api apis.{self._app}.{self._api}>"

    class _App:
        __slots__ = ("_channel", "_name")

        def __init__(self, channel, name):
            self._channel, self._name = channel, name

        def __getattr__(self, api):
            if api.startswith("_"):
                raise AttributeError(api)
            return _Api(self._channel, self._name, api)

        def __repr__(self):
            return f"<app apis.{self._name}>"

    class Apis:
        """The apps of this world: call apis.<app>.<api>(**kwargs)."""

        __slots__ = ("_channel",)

        def __init__(self, channel):
            self._channel = channel

        def __getattr__(self, app):
            if app.startswith("_"):
                raise AttributeError(app)
            return _App(self._channel, app)

        def __repr__(self):
            return "<apis: call apis.<app>.<api>(**kwargs)>"

    return Apis(_Channel()), ApiError


def _loop_hide_own_frames(own_dir):  # type: ignore[no-untyped-def]
    """Show tracebacks without this file's frames (IPython always shows the last frame)."""
    import types

    def strip(tb):
        kept = []
        while tb is not None:
            if not tb.tb_frame.f_code.co_filename.startswith(own_dir):
                kept.append(tb)
            tb = tb.tb_next
        stripped = None
        for old in reversed(kept):
            stripped = types.TracebackType(stripped, old.tb_frame, old.tb_lasti, old.tb_lineno)
        return stripped

    formatter = get_ipython().InteractiveTB  # noqa: F821 (an IPython builtin)
    format_traceback = formatter.structured_traceback

    def structured_traceback(etype, value, tb=None, *args, **kwargs):
        tb = strip(tb)
        if value is not None and tb is not None:
            value.__traceback__ = tb
        return format_traceback(etype, value, tb, *args, **kwargs)

    formatter.structured_traceback = structured_traceback


def _loop_cap_output(max_chars, dropped_mime):  # type: ignore[no-untyped-def]
    """Cap, here in the kernel, what one cell sends to the host.

    stdout, stderr and displayed values share a budget of `max_chars` characters per cell
    (what the host would show anyway); past it, text is dropped before it is ever sent and only
    its length goes to the host, once, after the cell. Host memory then stays flat however much
    a cell prints. Output of threads between cells draws on the last cell's spent budget.
    """
    import sys

    shell = get_ipython()  # noqa: F821 (an IPython builtin)
    state = {"left": max_chars, "dropped": 0}

    def take(text):
        if len(text) <= state["left"]:
            state["left"] -= len(text)
            return text
        kept = text[: max(state["left"], 0)]
        state["dropped"] += len(text) - len(kept)
        state["left"] = 0
        return kept

    last = {"stream": None}

    def capped_write(stream, write):
        def write_capped(text):
            if not isinstance(text, str):
                return write(text)  # the stream raises its own TypeError
            kept = take(text)
            if kept:
                # Each stream buffers on its own and flushes on a timer: flush the other one
                # when the writer switches, so stdout and stderr arrive in the order written.
                previous = last["stream"]
                if previous is not None and previous is not stream:
                    previous.flush()
                last["stream"] = stream
                write(kept)
            return len(text)

        return write_capped

    def capped_data(data):
        if not isinstance(data, dict):
            return data
        return {k: take(v) if isinstance(v, str) else v for k, v in data.items()}

    for stream in (sys.stdout, sys.stderr):
        stream.write = capped_write(stream, stream.write)

    publish = shell.display_pub.publish
    write_format_data = shell.displayhook.write_format_data

    def publish_capped(data, *args, **kwargs):
        return publish(capped_data(data), *args, **kwargs)

    def write_format_data_capped(format_dict, *args, **kwargs):
        return write_format_data(capped_data(format_dict), *args, **kwargs)

    shell.display_pub.publish = publish_capped
    shell.displayhook.write_format_data = write_format_data_capped

    def reset(*_):
        state["left"], state["dropped"] = max_chars, 0

    def report(*_):
        if state["dropped"]:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            publish({dropped_mime: str(state["dropped"])})

    shell.events.register("pre_run_cell", reset)
    shell.events.register("post_run_cell", report)


def _loop_cap_errors(max_chars):  # type: ignore[no-untyped-def]
    """Cap, here in the kernel, the error text of one cell, and do not echo its code.

    An exception's message is cut to half of `max_chars` and its traceback to `max_chars`, in
    both the error message and the cell's reply, each with the count of characters cut; the
    host's message limit (sandbox/channel.py) counts on these two fitting in one message. The
    kernel's broadcast of each cell's code (execute_input) is dropped: the host sent the code
    and never reads it back, and it is as long as the agent makes it.
    """
    shell = get_ipython()  # noqa: F821 (an IPython builtin)
    kernel = shell.kernel

    def cut(text, limit):
        text = str(text)
        if len(text) <= limit:
            return text
        return f"{text[:limit]}... [{len(text) - limit} characters cut]"

    class Text:  # what IPython formats with str(): an exception whose message is cut
        def __init__(self, text):
            self.text = text

        def __str__(self):
            return self.text

    show = shell._showtraceback

    def show_capped(etype, evalue, stb):
        stb = [cut("\n".join(map(str, stb)), max_chars)] if stb else stb
        return show(etype, Text(cut(evalue, max_chars // 2)), stb)

    do_execute = kernel.do_execute

    async def do_execute_capped(*args, **kwargs):
        reply = await do_execute(*args, **kwargs)
        if "evalue" in reply:
            reply["evalue"] = cut(reply["evalue"], max_chars // 2)
        return reply

    shell._showtraceback = show_capped
    kernel.do_execute = do_execute_capped
    kernel._publish_execute_input = lambda *args, **kwargs: None


_loop_watch_host(HOST_LIFELINE_FD)
apis, ApiError = _loop_make_apis(BRIDGE_SOCKET, MAX_REQUEST_BYTES)
_loop_hide_own_frames(BRIDGE_SOCKET.rsplit("/", 1)[0] + "/")
_loop_cap_output(MAX_OUTPUT_CHARS, DROPPED_MIME)
_loop_cap_errors(MAX_OUTPUT_CHARS)
del _loop_make_apis, _loop_hide_own_frames, _loop_cap_output, _loop_cap_errors, BRIDGE_SOCKET
del MAX_REQUEST_BYTES, MAX_OUTPUT_CHARS, DROPPED_MIME, _loop_watch_host, HOST_LIFELINE_FD
