"""The ReAct prompt for the app world: system message, instructions, a worked example, rules.

The worked example is a task in no split (`tasks.EXAMPLE_TASK`: "what is my manager's email
address?"), solved with the same APIs the agent has; each suite provides its messages
(`TaskSuite.example_messages`, e.g. tasks/apptown/example.py, which runs the example's code
against the world so its observations always match what the apps return). Messages are plain
role/content dicts; `loop/rollout/agent.py` turns them into token ids.
"""

from __future__ import annotations

from tasks import EXAMPLE_TASK, TaskSuite, format_assistant, format_observation

__all__ = [
    "EXAMPLE_TASK", "INSTRUCTIONS", "SYSTEM", "build_messages", "format_assistant",
    "format_observation", "prompt_example", "worked_example",
]  # fmt: skip

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


def build_messages(task_context: str, example: list[dict[str, str]]) -> list[dict[str, str]]:
    """The opening messages of an episode: system, instructions + example, then the task."""
    messages = [{"role": "system", "content": SYSTEM}]
    messages.append({"role": "user", "content": INSTRUCTIONS + f"\n\nTask: {EXAMPLE_TASK}"})
    messages += example
    closing = "That was the example. Now the real task, in a fresh session.\n\n"
    messages.append({"role": "user", "content": closing + task_context})
    return messages


def prompt_example(suite: TaskSuite, enabled: bool = True) -> list[dict[str, str]]:
    """The worked example's messages for an episode's prompt, or none (`agent.worked_example`)."""
    return list(worked_example(suite)) if enabled else []


def worked_example(suite: TaskSuite) -> tuple[dict[str, str], ...]:
    """The suite's worked example (`example_messages()`; suites build theirs once)."""
    return tuple(suite.example_messages())
