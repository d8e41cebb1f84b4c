"""AppTown's worked example for the agent's prompt: EXAMPLE_TASK solved with the world's APIs.

The observations are not written by hand: the example's code runs against the world when the
prompt is first built, so they always match what the apps return. The user is the first person
with exactly one manager.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import TYPE_CHECKING, Any

from tasks.apptown.server import AppServer, InProcessApis
from tasks.core import format_assistant, format_observation

if TYPE_CHECKING:
    from tasks.apptown.world import World

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


def example_messages(world: World) -> list[dict[str, str]]:
    """The example's turns with the observations `world` gives (see the module docstring)."""
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
    return messages
