"""AppTown: the built-in, AppWorld-style world of people and their apps, and its task suite.

See README.md in this directory for the apps, the number of APIs and the scenarios per split.
"""

from tasks.apptown.suite import AppTownSuite
from tasks.apptown.world import World

__all__ = ["AppTownSuite", "World"]
