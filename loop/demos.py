"""Demonstrations: agent episodes the policy is fine-tuned on, made by the real episode loop.

A demonstration is a `Trajectory` like any rollout: the same prompt, chat glue, token ids and
output mask, because it is played through `loop.rollout.collect.collect_rollouts` (real sandbox,
real environment, real grading) with a `ScriptedGenerator` standing in for the policy. Its reward is
the environment's own, so a demonstration that does not solve its task is visible and dropped.
Two sources:

- `gold_demonstrations`: each task's gold solution (a suite with `gold_solution(task)`), one
  turn per gold cell, each opened by a short thought that says what the step is for; the last
  thought quotes the output that answers the task. A helper function a cell defines but does
  not use moves to the first cell that calls it (`episode_cells`), so the first turn stays a
  short login and the helper is written where it is needed. `style="paper"` is the LOOP
  paper's SFT-GT variant (its App. C): one turn per top-level statement, the statement's
  comments as the thought, and every observation replaced by "Execution successful.".
  `style="careful"` is the episode style as a careful agent plays it: before the first call of
  an app's API (a login aside) a turn reads that API's documentation, and in half the tasks
  (a stable hash of the task id) a wrong guess at the API's name comes first, fails, and the
  thought of the documentation turn says so: a failed call followed by a recovery. The wrong
  call is a `Mistake`: the agent sees it and its error, but its tokens are not trained on.
  `style="lookup"` teaches how to find an API rather than which one to call: before the first
  call of each app the task uses, a turn lists the app's APIs (`show_api_descriptions`) and the
  next names the one for the step (quoting the words of its name the task says: `naming_words`)
  and reads its documentation; the wrong guess comes first in
  half the (task, app) pairs. An agent that knows no name of an unfamiliar app's APIs can copy
  one from the list, where a careful agent could only guess (and mostly guessed wrong names on
  the `lookup` band: configs/quickstart-lookup.yaml). With `read_fraction` below 1 only that
  share of the tasks (careful) or (task, app) pairs (lookup) read; the others call the API
  straight away: a policy that reads sometimes, so that RL can find where reading pays.
- `replayed_demonstrations`: the assistant messages of successful rollouts from rollouts files
  (any run, any model: a teacher evaluated through the `openai` backend, say), replayed through
  the real environment with this policy's tokenizer, so they become token-exact for the student;
  a replay that no longer reaches `min_reward` is dropped.
"""

from __future__ import annotations

import ast
import asyncio
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from loop.config import AgentConfig
from loop.generators.scripted import Message, ScriptedGenerator
from loop.generators.tokenizer import Tokenizer
from loop.rollout.collect import RolloutJob, SandboxPool, collect_rollouts
from loop.rollout.prompt import format_assistant
from loop.rollout.trajectory import Trajectory
from tasks import Environment, GoldSolutions, SandboxLike, Task, TaskSuite

DemoStyle = Literal["episode", "paper", "careful", "lookup"]
PAPER_OBSERVATION = "Execution successful."
CALL = re.compile(r"apis\.(\w+)\.(\w+)\(")
PAGED = re.compile(r"apis\.(\w+)\.(\w+)\b(?!\s*\()")  # an API handed to a helper, not called
REFERENCE = re.compile(r"apis\.(\w+)\.(\w+)\b")  # called or handed to a helper
ANSWER = re.compile(r"complete_task\(\s*answer\s*=\s*(.+)\)\s*$", re.DOTALL)
READ_FRACTION_STEPS = 1000  # read_fraction's resolution in the hash that picks the readers
QUOTED_OUTPUT_CHARS = 80  # the last thought quotes the previous output when it is this short


# The careful style's wrong guess at an API's name: its verb swapped for a likely other one.
WRONG_VERBS = {
    "show": "get", "get": "show", "search": "find", "find": "search", "add": "create",
    "create": "add", "like": "favorite", "send": "write", "delete": "remove", "update": "edit",
}  # fmt: skip


class DemonstrationError(ValueError):
    """Demonstrations cannot be made as configured (stated in one line)."""


class Mistake(str):
    """An assistant message a demonstration shows but does not train on (the careful style's
    wrong call: the policy learns what follows a failed call, never to make one)."""


def gold_scripts(
    suite: TaskSuite, task: Task, style: DemoStyle = "episode", read_fraction: float = 1.0
) -> list[Message]:
    """The assistant messages of `task`'s gold solution, thought + code per turn (`read_fraction`:
    `careful_turns`')."""
    if not isinstance(suite, GoldSolutions):  # a declared Protocol (tasks/core.py)
        raise DemonstrationError(
            f"suite {suite.name} has no gold solutions: use demonstrations from rollouts files"
        )
    cells = list(suite.gold_solution(task))
    if style == "paper":
        return [format_assistant(*step) for cell in cells for step in statements(cell)]
    cells = episode_cells(cells)
    last = len(cells) - 1
    turns = [_episode_turn(cell, final=i == last) for i, cell in enumerate(cells)]
    if style in ("careful", "lookup"):
        return careful_turns(
            cells, turns, task.id, lookup=style == "lookup", task=task.instruction,
            read_fraction=read_fraction,
        )  # fmt: skip
    return turns


def careful_turns(
    cells: Sequence[str],
    turns: list[Message],
    task_id: str,
    *,
    lookup: bool = False,
    task: str = "",
    read_fraction: float = 1.0,
) -> list[Message]:
    """`turns` with the careful style's reading turns before the first cell that uses an app's
    API, called or handed to a paging helper: for the first app used, or (`lookup`) for each
    app, with its APIs listed first and the choice tied to the words of `task` (the
    instruction) that name it (see the module docstring); unchanged when none is used. Only
    `read_fraction` of the tasks (`lookup`: of the (task, app) pairs) read, by a stable hash;
    the others call the API straight away, as the `episode` style does."""
    firsts = first_uses(cells)
    out = list(turns)
    for index, app, api in reversed(firsts if lookup else firsts[:1]):
        key = f"{task_id}/{app}" if lookup else task_id  # which (task, app) guesses wrong first
        if not _reads(key, read_fraction):
            continue
        guess_first = zlib.crc32(key.encode()) % 2 == 1
        out[index:index] = _reading_turns(app, api, guess_first, lookup, task)
    return out


def _reads(key: str, fraction: float) -> bool:
    """Whether the task (or (task, app) pair) `key` is one of the `fraction` that read, by a
    stable hash of it (another than the wrong guess's, so the two are independent)."""
    share = zlib.crc32(f"read {key}".encode()) % READ_FRACTION_STEPS
    return share < round(fraction * READ_FRACTION_STEPS)


def first_uses(cells: Sequence[str]) -> list[tuple[int, str, str]]:
    """(cell index, app, api) of each app's first API reference (a login, the supervisor and
    the documentation aside), in the order the cells make them."""
    seen: dict[str, tuple[int, str, str]] = {}
    for i, cell in enumerate(cells):
        for app, api in REFERENCE.findall(cell):
            if app not in ("supervisor", "api_docs") and api != "login" and app not in seen:
                seen[app] = (i, app, api)
    return list(seen.values())


def naming_words(api: str, task: str) -> list[str]:
    """The words of `api`'s name that the task's instruction uses, singular or plural
    (`show_liked_songs`, "How many songs have I liked?": songs, liked): what ties a task to an
    API in a list of names."""
    said = set(re.findall(r"[a-z]+", task.lower()))
    return [w for w in api.split("_") if len(w) > 2 and {w, w.rstrip("s"), w + "s"} & said]


def _reading_turns(
    app: str, api: str, guess_first: bool, lookup: bool, task: str = ""
) -> list[Message]:
    """The turns a careful agent plays before its first use of `app.api`."""
    doc = f'print(apis.api_docs.show_api_doc(app_name="{app}", api_name="{api}"))'
    verb, _, rest = api.partition("_")
    wrong = f"{WRONG_VERBS.get(verb, 'get')}_{rest or verb}"
    failed = f"That call failed: {app}.{wrong} is not an API."
    turns: list[Message] = []
    if guess_first:
        guess = f"Next I use {app}.{wrong} for what the task asks."
        turns.append(Mistake(format_assistant(guess, f"print(apis.{app}.{wrong}())")))
    if not lookup:
        read = (
            f"{failed} I read the documentation of {app}.{api}."
            if guess_first
            else f"Before I call {app}.{api} I read its documentation, to pass the right arguments."
        )
        return [*turns, format_assistant(read, doc)]
    listing = f'print(apis.api_docs.show_api_descriptions(app_name="{app}"))'
    why = f"{failed} I list" if guess_first else f"I have not used {app} yet: I list"
    words = " and ".join(f'"{w}"' for w in naming_words(api, task))
    chosen = f"The task says {words}: {app}.{api}" if words else f"{app}.{api}"
    read = f"{chosen} is the API for this step: I read its documentation, for its arguments."
    return [
        *turns,
        format_assistant(f"{why} the APIs of {app} to find the one for this step.", listing),
        format_assistant(read, doc),
    ]


def untrain_mistakes(traj: Trajectory, messages: Sequence[Message]) -> None:
    """Clear the output mask of the turns played from `Mistake` messages; each must have failed
    (else the demonstration would show a recovery from nothing)."""
    for turn, message in zip(traj.turns, messages, strict=False):
        if isinstance(message, Mistake):
            if turn.error is None:
                raise DemonstrationError(
                    f"task {traj.task_id}: the careful style's wrong call did not fail: "
                    f"{turn.code!r}"
                )
            traj.is_output[turn.output_start : turn.output_end] = [False] * (
                turn.output_end - turn.output_start
            )


def episode_cells(cells: Sequence[str]) -> list[str]:
    """The cells as an agent would write them: a top-level function that a cell defines but does
    not use moves to the front of the first later cell that uses it (and is dropped when none
    does). The code run is the same; each turn just holds what it needs."""
    cells = list(cells)
    for i, cell in enumerate(cells):
        lines = cell.splitlines()
        for node in reversed(ast.parse(cell).body):
            if not isinstance(node, ast.FunctionDef) or _uses(cell, node.name, skip=node):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            helper = "\n".join(lines[first : node.end_lineno])
            del lines[first : node.end_lineno]
            user = next((j for j in range(i + 1, len(cells)) if _uses(cells[j], node.name)), None)
            if user is not None:
                cells[user] = f"{helper}\n\n{cells[user]}"
        cells[i] = _tidy(lines)
    return cells


def _uses(code: str, name: str, skip: ast.AST | None = None) -> bool:
    """Whether `code` refers to `name` outside the `skip` node."""
    inside = set() if skip is None else {id(n) for n in ast.walk(skip)}
    return any(
        isinstance(n, ast.Name) and n.id == name and id(n) not in inside
        for n in ast.walk(ast.parse(code))
    )


def _tidy(lines: list[str]) -> str:
    """Lines joined with runs of blank lines collapsed to one, none at either end."""
    kept: list[str] = []
    for line in lines:
        if line.strip() or (kept and kept[-1].strip()):
            kept.append(line)
    return "\n".join(kept).strip("\n")


def statements(cell: str) -> list[tuple[str, str]]:
    """A cell split into top-level statements (a loop or def stays whole), each with a thought:
    the comment lines right above it, else a description of its API calls."""
    lines = cell.splitlines()
    body = ast.parse(cell).body
    steps = []
    for node in body:
        first = node.lineno - 1
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = min([first] + [d.lineno - 1 for d in node.decorator_list])
        comments: list[str] = []
        while first - len(comments) - 1 >= 0:
            above = lines[first - len(comments) - 1].strip()
            if not above.startswith("#"):
                break
            comments.insert(0, above.lstrip("# ").strip())
        code = "\n".join(lines[first : node.end_lineno]).strip()
        steps.append((" ".join(c for c in comments if c) or describe(code), code))
    return steps


def describe(code: str) -> str:
    """A one-line thought for a cell from the APIs it calls."""
    calls = list(dict.fromkeys(f"{app}.{api}" for app, api in CALL.findall(code)))
    logins = [c.split(".")[0] for c in calls if c.endswith(".login")]
    if logins:
        apps = " and ".join(logins)
        return f"First I read my profile and account passwords and log in to {apps}."
    answer = ANSWER.search(code.strip())
    if answer:
        return f"I have the answer in `{answer.group(1).strip()}`, so I pass it to complete_task."
    if "supervisor.complete_task" in code:
        return "The change is done and the task asks for no answer, so I mark it complete."
    data = [c for c in calls if not c.startswith(("supervisor.", "api_docs."))]
    paged = [f"{app}.{api}" for app, api in PAGED.findall(code) if f"{app}.{api}" not in calls]
    if paged:
        then = f", then {', then '.join(data)}" if data else ""
        return f"Next I read every page of {', then '.join(paged)} (it is paginated){then}."
    if data:
        return f"Next I use {', then '.join(data)} for what the task asks."
    return "Next I work out what the task asks from what I have."


def _episode_turn(cell: str, *, final: bool) -> Message:
    thought = describe(cell)
    if not (final and ANSWER.search(cell.strip())):
        return format_assistant(thought, cell)

    def quoting_output(messages: list[dict[str, str]]) -> str:
        output = _last_output(messages)
        if output and len(output) <= QUOTED_OUTPUT_CHARS and "\n" not in output:
            return format_assistant(
                f"The output is {output}, which answers the task. {thought}", cell
            )
        return format_assistant(thought, cell)

    return quoting_output


def _last_output(messages: list[dict[str, str]]) -> str | None:
    """The text of the last observation (between the ``` fences of `format_observation`)."""
    if not messages or messages[-1]["role"] != "user":
        return None
    content = messages[-1]["content"]
    start, end = content.find("```\n"), content.rfind("\n```")
    return content[start + 4 : end].strip() if 0 <= start < end else None


def assistant_messages(traj: Trajectory) -> list[str]:
    """The assistant messages of a finished rollout, in order (what a replay plays back)."""
    return [turn.text for turn in traj.turns]


async def play(
    scripts: Sequence[tuple[Task, Sequence[Message]]],
    *,
    suite: TaskSuite,
    pool: SandboxPool,
    tokenizer: Tokenizer,
    settings: AgentConfig,
    example: list[dict[str, str]],
    max_concurrent: int,
    paper_observations: bool = False,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Play each (task, messages) script through the real episode loop; graded trajectories.

    `paper_observations` shows the agent "Execution successful." after every cell (the code
    still runs for real, so the final state and the reward are the real ones).
    """
    slots = asyncio.Semaphore(max_concurrent)
    env_suite: TaskSuite = _PaperObservations(suite) if paper_observations else suite

    async def one(index: int, task: Task, messages: Sequence[Message]) -> Trajectory:
        generator = ScriptedGenerator(tokenizer, messages)
        async with slots:
            [traj] = await collect_rollouts(
                [RolloutJob(task, index, seed=index)], suite=env_suite, pool=pool,
                generator=generator, tokenizer=tokenizer, settings=settings,
                example=example, max_concurrent=1, on_done=on_done,
            )  # fmt: skip
        untrain_mistakes(traj, messages)
        return traj

    return list(await asyncio.gather(*(one(i, t, m) for i, (t, m) in enumerate(scripts))))


def demo_settings(settings: AgentConfig, scripts: Sequence[tuple[Any, Sequence[Message]]]) -> Any:
    """The agent settings with room for the longest script (greedy, no turn cap below it)."""
    import dataclasses

    longest = max((len(messages) for _, messages in scripts), default=1)
    return dataclasses.replace(settings, max_turns=max(settings.max_turns, longest))


def read_successful_rollouts(paths: Sequence[Path | str], min_reward: float) -> list[Trajectory]:
    """Rollouts whose reward reaches `min_reward`, from run dirs, eval dirs or rollouts files."""
    from loop.run.records import InspectError, find_sources, read_rollouts

    found: list[Trajectory] = []
    for path in paths:
        try:
            sources = find_sources(Path(path))
        except InspectError as exc:
            raise DemonstrationError(str(exc)) from None
        for source in sources:
            for rollout in read_rollouts(source, with_tokens=False):
                traj = rollout.traj
                if traj.reward is not None and traj.reward >= min_reward and traj.turns:
                    found.append(traj)
    return found


class _PaperObservations:
    """A suite whose environments answer every cell with "Execution successful."."""

    def __init__(self, suite: TaskSuite) -> None:
        self.suite = suite
        self.name = suite.name
        self.uses_sandbox = suite.uses_sandbox
        self.marks_collateral = suite.marks_collateral
        self.replays_exactly = suite.replays_exactly

    @property
    def splits(self) -> dict[str, list[Task]]:
        return self.suite.splits

    def tasks(self, split: str) -> list[Task]:
        return self.suite.tasks(split)

    def task(self, task_id: str) -> Task:
        return self.suite.task(task_id)

    def example_messages(self) -> list[dict[str, str]]:
        return self.suite.example_messages()

    def make_env(self, task: Task, sandbox: SandboxLike | None) -> Any:
        return _PaperEnv(self.suite.make_env(task, sandbox))


class _PaperEnv:
    """The wrapped environment, with `astep`'s observation replaced."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    async def astep(self, code: str) -> str:
        await self.env.astep(code)
        return PAPER_OBSERVATION
