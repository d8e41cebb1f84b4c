"""Every AppTown scenario, grouped by split (each module lists its scenarios in a tuple)."""

from __future__ import annotations

from tasks.apptown.scenario import Scenario
from tasks.apptown.scenarios.dev import DEV
from tasks.apptown.scenarios.dev_files import DEV_FILES
from tasks.apptown.scenarios.lookup_single import LOOKUP_SINGLE
from tasks.apptown.scenarios.lookup_warm import LOOKUP_WARM
from tasks.apptown.scenarios.test_challenge_long import TEST_CHALLENGE
from tasks.apptown.scenarios.test_normal import TEST_NORMAL
from tasks.apptown.scenarios.test_normal_email import TEST_NORMAL_EMAIL
from tasks.apptown.scenarios.train_chains import TRAIN_CHAINS
from tasks.apptown.scenarios.train_multi import TRAIN_MULTI_APP
from tasks.apptown.scenarios.train_single import TRAIN_SINGLE_APP

SCENARIOS: tuple[Scenario, ...] = (
    *TRAIN_SINGLE_APP,
    *TRAIN_MULTI_APP,
    *TRAIN_CHAINS,
    *DEV,
    *DEV_FILES,
    *TEST_NORMAL,
    *TEST_NORMAL_EMAIL,
    *TEST_CHALLENGE,
    *LOOKUP_SINGLE,
    *LOOKUP_WARM,
)
