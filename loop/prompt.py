"""The ReAct prompt for the app world: system message, instructions, a worked example, rules.

The worked example is a task in no split ("what is my manager's email address?"), solved with
the same APIs the agent has. Its observations are not written by hand: the example's code runs
against the world when the prompt is built, so they always match what the apps return.
Messages are plain role/content dicts; `loop/agent.py` turns them into token ids.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from typing import Any

from tasks.apptown.inprocess import InProcessApis
from tasks.apptown.server import AppServer

SYSTEM = (
    "You are a careful assistant that completes tasks for a user by writing Python code. "
    "Your code runs in a persistent Python session where an `apis` object reaches the user's apps."
)

INSTRUCTIONS = """I am your supervisor. Complete my task by talking to my apps through APIs.

Each turn, write one short thought, then one block of Python code:
```python
# your code
```
I run the code and show you its output; variables persist between turns.

Three APIs tell you everything about the apps:
- `apis.api_docs.show_app_descriptions()` lists the apps.
- `apis.api_docs.show_api_descriptions(app_name="phone")` lists an app's APIs.
- `apis.api_docs.show_api_doc(app_name="phone", api_name="search_contacts")` shows one API's
  parameters and response.

Rules:
- Read an API's doc before you call it for the first time; never guess parameters.
- My credentials are in `apis.supervisor`: `show_profile()` and `show_account_passwords()`.
  Log in to an app with its `login` API before using it.
- List APIs return one page at a time: loop over `page_index` until a page comes back short.
- Look things up instead of assuming them; do only what the task asks.
- When you are done, call `apis.supervisor.complete_task(answer=...)` with the answer, or
  `apis.supervisor.complete_task()` if the task asks for no answer.

Here is an example."""

EXAMPLE_TASK = "What is the email address of my manager?"
EXAMPLE_TURNS: tuple[tuple[str, str], ...] = (
    (
        "The manager is a relationship, so the phone app's contacts should have it. "
        "Let me see the phone APIs.",
        'print(apis.api_docs.show_api_descriptions(app_name="phone"))',
    ),
    (
        "search_contacts looks right. Let me read its doc.",
        'print(apis.api_docs.show_api_doc(app_name="phone", api_name="search_contacts"))',
    ),
    (
        "It needs a login and filters by relationship. I'll get my credentials and log in.",
        "profile = apis.supervisor.show_profile()\n"
        "passwords = {a['account_name']: a['password'] "
        "for a in apis.supervisor.show_account_passwords()}\n"
        "print(apis.phone.login(username=profile['phone_number'], password=passwords['phone']))",
    ),
    (
        "Now I search for managers, page by page.",
        "managers, page = [], 0\n"
        "while True:\n"
        "    batch = apis.phone.search_contacts(relationship='manager', page_index=page, "
        "page_limit=20)\n"
        "    managers += batch\n"
        "    if len(batch) < 20:\n"
        "        break\n"
        "    page += 1\n"
        "print([(m['first_name'], m['last_name'], m['email']) for m in managers])",
    ),
    (
        "There is exactly one manager. I'll give the email as the answer.",
        "apis.supervisor.complete_task(answer=managers[0]['email'])",
    ),
)


def format_assistant(thought: str, code: str) -> str:
    """An assistant message in the shape the agent is asked to write."""
    return f"{thought}\n```python\n{code}\n```"


def format_observation(output: str) -> str:
    """A user message carrying a cell's output."""
    return f"Output:\n```\n{output}\n```"


def build_messages(task_context: str, example: list[dict[str, str]]) -> list[dict[str, str]]:
    """The opening messages of an episode: system, instructions + example, then the task."""
    messages = [{"role": "system", "content": SYSTEM}]
    messages.append({"role": "user", "content": INSTRUCTIONS + f"\n\nTask: {EXAMPLE_TASK}"})
    messages += example
    closing = "That was the example. Now the real task, in a fresh session.\n\n"
    messages.append({"role": "user", "content": closing + task_context})
    return messages


def prompt_example(suite: Any, enabled: bool = True) -> list[dict[str, str]]:
    """The worked example's messages for an episode's prompt, or none (`agent.worked_example`)."""
    return list(worked_example(suite)) if enabled else []


@functools.cache
def worked_example(suite: Any) -> tuple[dict[str, str], ...]:
    """The example's turns with real observations, computed once per suite.

    A suite with its own demonstration provides `example_messages()` (alternating assistant
    and user messages, ending with the assistant's `complete_task`); otherwise the built-in
    world's example is run against `suite.world`.
    """
    if hasattr(suite, "example_messages"):
        return tuple(suite.example_messages())
    world = suite.world
    user = next(p for p in world.society.people if len(world.society.related(p.id, "manager")) == 1)
    server = AppServer(world.template.fork(), user.id, world.now)
    namespace: dict[str, Any] = {"apis": InProcessApis(server)}
    messages: list[dict[str, str]] = []
    for thought, code in EXAMPLE_TURNS:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, "<example>", "exec"), namespace)
        messages.append({"role": "assistant", "content": format_assistant(thought, code)})
        if not server.ctx.completed:
            output = buffer.getvalue().rstrip() or "Execution successful."
            messages.append({"role": "user", "content": format_observation(output)})
    assert server.ctx.completed, "the worked example must end with complete_task"
    json.dumps(messages)  # plain data only
    return tuple(messages)
