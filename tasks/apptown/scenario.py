"""What a scenario is: a task template with 3 variants, a setup, a gold and a wrong solution, and
its state-based tests. Plus the helpers scenarios share.

A scenario subclasses `Scenario` once (no deeper) and fills in five hooks:

- `variants(world)`: three `Variant`s (different users, values and wording), chosen
  deterministically from the world;
- `setup(db, world, v)`: the rows this variant needs on top of the world (optional);
- `gold(v)`: the solution, as code cells an agent would write, using only `apis`;
- `wrong(v)`: a plausible wrong solution (what it gets wrong is `mistake`), which must fail;
- `evaluate(g, v)`: the tests, computing the truth from the initial state, never from the
  gold solution, and always ending with the collateral-damage check.

Variants 1-3 belong to the scenario's `split`. A scenario may list `more_variants`, bands of
further variants that go to other splits (the easy scenarios feed the `easy` and `easy_heldout`
splits this way, some difficulty-2 train scenarios the `lookup` and `lookup_heldout` ones). Their
users and values come from a random stream of their own, so adding or resizing a band never
changes variants 1-3, and the bands are drawn in order, so a later band never changes an earlier
one.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from tasks.apptown.grading import Grader
from tasks.apptown.people import Person
from tasks.apptown.world import World, insert_row

# The lookup band: beyond its 3 train variants, each difficulty-2 scenario that lists it has 5
# held-out variants (split `lookup_heldout`) and 10 for training (split `lookup`). Held-out first,
# as the easy band's. 18 users a scenario in all: the roommate scenarios draw them from the 21-25
# people who have a roommate (seeds 0-5), and the easy band's 3 + 6 + 12 would take all 21 of
# seed 0's.
LOOKUP_BANDS: tuple[tuple[str, int], ...] = (("lookup_heldout", 5), ("lookup", 10))


@dataclass(frozen=True)
class Variant:
    """One variant of a scenario: who the user is, what they ask, and the values involved."""

    n: int  # 1, 2 or 3
    user_id: int
    instruction: str
    params: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.params[key]


class Scenario:
    """Base of every scenario; subclasses set the class attributes and override the hooks."""

    id: ClassVar[str]
    difficulty: ClassVar[int]
    apps: ClassVar[tuple[str, ...]]
    split: ClassVar[str]
    mistake: ClassVar[str]  # what `wrong` gets wrong, in a few words
    more_variants: ClassVar[tuple[tuple[str, int], ...]] = ()  # (split, count) after variant 3

    @property
    def num_variants(self) -> int:
        """Variants 1-3, then every band of `more_variants`."""
        return 3 + sum(count for _, count in self.more_variants)

    def split_of(self, n: int) -> str:
        """The split of variant `n` (1-based)."""
        if n <= 3:
            return self.split
        first = 4
        for split, count in self.more_variants:
            if n < first + count:
                return split
            first += count
        raise ValueError(f"{self.id} has no variant {n} (it has {self.num_variants})")

    def variants(self, world: World) -> list[Variant]:
        raise NotImplementedError

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        """Add what this variant needs to the world's state (default: nothing)."""

    def gold(self, v: Variant) -> list[str]:
        raise NotImplementedError

    def wrong(self, v: Variant) -> list[str]:
        raise NotImplementedError

    def evaluate(self, g: Grader, v: Variant) -> None:
        raise NotImplementedError

    def rng(self, world: World, stream: str = "") -> random.Random:
        """This scenario's own random stream (seeding with a string is stable across runs);
        `stream` names another, independent one (e.g. for the `more_variants` bands)."""
        return random.Random(f"{world.seed}/{self.id}" + (f"/{stream}" if stream else ""))

    def pick_users(self, world: World, candidates: list[int]) -> list[int]:
        """`num_variants` distinct users from `candidates`: the first three from this scenario's
        random stream, the rest (for `more_variants`) from the "more" stream."""
        pool = sorted(set(candidates))
        assert len(pool) >= self.num_variants, f"{self.id}: only {len(pool)} candidate users"
        first = self.rng(world).sample(pool, 3)
        rest = [u for u in pool if u not in first]
        return first + self.rng(world, "more").sample(rest, self.num_variants - 3)

    def variant_rngs(self, world: World) -> list[random.Random]:
        """One random stream per variant for its values: the scenario's stream for variants 1-3
        (shared, used in order, as before bands existed), the "more-values" stream after."""
        first, more = self.rng(world), self.rng(world, "more-values")
        return [first if i < 3 else more for i in range(self.num_variants)]

    def make_variants(
        self, users: list[int], wordings: tuple[str, ...], params: list[dict[str, Any]]
    ) -> list[Variant]:
        """Variant n: user n, wording n (cycling through `wordings`) formatted with params n."""
        assert len(users) == len(params) == self.num_variants, (self.id, len(users), len(params))
        return [
            Variant(n, user, wordings[(n - 1) % len(wordings)].format(**p), p)
            for n, (user, p) in enumerate(zip(users, params, strict=True), 1)
        ]


PAGES_HELPER = '''

def all_pages(api, **kwargs):
    """Call a paginated API page by page until a page comes back short."""
    items, page = [], 0
    while True:
        batch = api(page_index=page, page_limit=20, **kwargs)
        items += batch
        if len(batch) < 20:
            return items
        page += 1
'''
_PRELUDE = (
    "profile = apis.supervisor.show_profile()\n"
    'passwords = {a["account_name"]: a["password"]\n'
    "             for a in apis.supervisor.show_account_passwords()}\n" + PAGES_HELPER + "\n"
)


def login_cell(*apps: str) -> str:
    """The first cell of a solution: read the profile and passwords, log in to `apps`."""
    lines = [_PRELUDE]
    for app in apps:
        user = 'profile["phone_number"]' if app == "phone" else 'profile["email"]'
        lines.append(f'apis.{app}.login(username={user}, password=passwords["{app}"])')
    return "\n".join(lines)


def contacts_with(g: Grader, user_id: int, label: str) -> list[dict[str, Any]]:
    """The user's phone contacts that have relationship `label`, in the initial state."""
    return g.before(
        "SELECT * FROM phone_contacts WHERE owner_id = ? AND EXISTS "
        "(SELECT 1 FROM json_each(relationships) WHERE value = ?) ORDER BY id",
        (user_id, label),
    )


def person_ids(g: Grader) -> dict[str, int]:
    """Every person's id by email address, in the initial state."""
    return {r["email"]: r["id"] for r in g.before("SELECT id, email FROM people")}


def people_with(world: World, user_id: int, label: str) -> list[Person]:
    """Who is `label` to the user (as their phone contacts say, before any setup)."""
    return [world.person(pid) for pid in world.society.related(user_id, label)]


def add_email(
    db: sqlite3.Connection,
    sender: int,
    recipient: int,
    subject: str,
    body: str,
    sent_at: str,
    *,
    archived: bool = False,
    attachments: tuple[tuple[str, str], ...] = (),
) -> int:
    """Deliver an email (a thread of its own) with optional (file_name, content) attachments."""
    email_id = insert_row(
        db,
        "email_emails",
        thread_id=0,
        sender_id=sender,
        subject=subject,
        body=body,
        sent_at=sent_at,
    )
    db.execute("UPDATE email_emails SET thread_id = ? WHERE id = ?", (email_id, email_id))
    insert_row(
        db,
        "email_recipients",
        email_id=email_id,
        person_id=recipient,
        is_starred=0,
        is_archived=int(archived),
    )
    for file_name, text in attachments:
        insert_row(db, "email_attachments", email_id=email_id, file_name=file_name, content=text)
    return email_id


def days_ago(world: World, days: float) -> str:
    """An ISO timestamp `days` before the world's clock."""
    return (world.now - timedelta(days=days)).isoformat(timespec="seconds")


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


def columns(rows: list[dict[str, Any]], *names: str) -> dict[int, tuple[str, ...]]:
    """An allowance for `check_no_other_changes`: these rows may change only in `names`."""
    return {r["id"]: names for r in rows}


def names(rows: list[dict[str, Any]]) -> str:
    """Readable names of people or contact rows, for failure messages."""
    return ", ".join(f"{r['first_name']} {r['last_name']}" for r in rows) or "nobody"
