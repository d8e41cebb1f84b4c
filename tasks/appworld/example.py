"""AppWorld's worked example for the agent's prompt: EXAMPLE_TASK, solved in AppTown.

AppTown's APIs mirror AppWorld's for this episode (api_docs, the supervisor's credentials, the
phone app's login and paged `search_contacts`), so the example is AppTown's, run against a
freshly built AppTown world (seed 0, 72 people): it needs no AppWorld engine, and the prompt is
the same one AppWorld runs have always used. A recorded AppWorld episode can replace it here.
"""

from __future__ import annotations

from tasks.apptown.example import example_messages as apptown_example
from tasks.apptown.world import World


def example_messages() -> list[dict[str, str]]:
    """The worked example's messages (built once per suite by `AppWorldSuite`)."""
    return apptown_example(World.build(0, 72))
