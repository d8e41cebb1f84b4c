"""A seeded generator of AppTown's society: people, families, households, companies, friends.

Relationships are directed labels: `relations[(a, b)]` is the set of things person b is to
person a ("manager" means b is a's manager; the manager sees a as a "coworker"). They end up as
the `relationships` of a's phone contact for b, which is the only place an agent can learn them:
the payments app has its own, different, friend list, so an agent that treats payment friends as
roommates fails (the behaviour of Figure 6 in the LOOP paper).
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from itertools import combinations

RELATIONSHIPS = (
    "roommate",
    "partner",
    "sibling",
    "parent",
    "child",
    "coworker",
    "manager",
    "friend",
)

FIRST_NAMES = """
Aaliyah Adrian Aisha Alma Amara Andre Anika Arjun Astrid Beatriz Bennett Bianca Caleb Camila
Chen Chiara Dalia Damian Daria Dev Diego Elena Elias Emeka Esme Ezra Farah Felix Freya
Gideon Hana Hugo Imani Ines Isaac Ivy Jasper Javier Jonah Juno Kai Kamala Keanu Kenji Lars
Leila Leon Lucia Luka Mabel Malik Mara Marco Mei Milo Mina Nadia Naomi Nico Nina Noor Olga
Omar Oscar Paloma Pavel Priya Quentin Rafael Rania Reza Rosa Ruben Saanvi Samir Selma Silas
Sofia Soren Tariq Tessa Theo Uma Valeria Viktor Wanda Wes Ximena Yara Yusuf Zadie Zane Zora
Ingrid Otto Petra
""".split()  # noqa: SIM905 - a word list reads best as words

LAST_NAMES = """
Abara Bergstrom Castillo Dubois Eriksen Fontaine Garza Haddad Ivanova Jensen Kowalski
Lindqvist Moreau Nakamura Okafor Petrov Quiroga Rossi Santos Takahashi Underwood Varga
Whitfield Xu Yilmaz Zamora Brennan Delacroix Esposito Falk
""".split()  # noqa: SIM905 - a word list reads best as words

DOMAINS = ("townmail.com", "postbox.net", "inbox.org")
COMPANIES = ("Northwind", "Bluebird Labs", "Cedar Health", "Orbit Foods", "Quill Media", "Tidal")


@dataclass(frozen=True)
class Person:
    """One member of the society, as every app's directory knows them."""

    id: int
    first_name: str
    last_name: str
    email: str
    phone_number: str
    birthday: str  # ISO date

    @property
    def name(self) -> str:
        return f"{self.first_name} {self.last_name}"


@dataclass
class Society:
    """People plus their directed relationship labels and employers."""

    people: list[Person]
    relations: dict[tuple[int, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    employer: dict[int, str] = field(default_factory=dict)

    def link(self, a: int, b: int, b_to_a: str, a_to_b: str) -> None:
        """Record that b is `b_to_a` of a, and a is `a_to_b` of b."""
        self.relations[(a, b)].add(b_to_a)
        self.relations[(b, a)].add(a_to_b)

    def related(self, a: int, label: str) -> list[int]:
        """The ids of everyone who is `label` to person a, sorted."""
        return sorted(b for (x, b), labels in self.relations.items() if x == a and label in labels)


def generate_society(rng: random.Random, n_people: int) -> Society:
    """Families first, then couples and roommates among the adult children, then companies."""
    assert n_people <= len(FIRST_NAMES), f"only {len(FIRST_NAMES)} distinct first names"
    firsts = rng.sample(FIRST_NAMES, n_people)
    lasts = rng.sample(LAST_NAMES, len(LAST_NAMES))
    people: list[Person] = []
    families: list[tuple[list[int], list[int]]] = []
    while len(people) < n_people:
        last = lasts[len(families) % len(lasts)]
        size = min(rng.choice((3, 4, 4, 5)), n_people - len(people))
        members = [
            _person(rng, len(people) + i + 1, firsts[len(people) + i], last, i < 2)
            for i in range(size)
        ]
        people += members
        ids = [p.id for p in members]
        families.append((ids[:2], ids[2:]))
    society = Society(people)
    for parents, children in families:
        if len(parents) == 2:
            society.link(parents[0], parents[1], "partner", "partner")
        for child in children:
            for parent in parents:
                society.link(child, parent, "parent", "child")
        for c1, c2 in combinations(children, 2):
            society.link(c1, c2, "sibling", "sibling")
    _households(rng, society, [c for _, children in families for c in children])
    _companies(rng, society, families)
    for person in people:
        for other in rng.sample(people, 4):
            if other.id != person.id:
                society.link(person.id, other.id, "friend", "friend")
    return society


def _person(rng: random.Random, pid: int, first: str, last: str, is_parent: bool) -> Person:
    year = rng.randint(1956, 1972) if is_parent else rng.randint(1986, 2003)
    born = date(year, 1, 1) + timedelta(days=rng.randrange(365))
    phone = f"{rng.randint(201, 989)}{rng.randint(200, 999)}{rng.randint(1000, 9999)}"
    domain = DOMAINS[pid % len(DOMAINS)]
    email = f"{first.lower()}.{last.lower()}@{domain}"
    return Person(pid, first, last, email, phone, born.isoformat())


def _households(rng: random.Random, society: Society, young: list[int]) -> None:
    """Pair some adult children as partners; group most of the rest as roommates of 2-3."""
    pool = young[:]
    rng.shuffle(pool)
    n_couples = len(pool) // 6
    for i in range(n_couples):
        a, b = pool[2 * i], pool[2 * i + 1]
        if not society.relations.get((a, b)):
            society.link(a, b, "partner", "partner")
    rest = pool[2 * n_couples :]
    while len(rest) >= 2:
        size = 3 if len(rest) >= 5 and rng.random() < 0.5 else 2
        group, rest = rest[:size], rest[size:]
        for a, b in combinations(group, 2):
            if "sibling" not in society.relations.get((a, b), set()):
                society.link(a, b, "roommate", "roommate")


def _companies(
    rng: random.Random, society: Society, families: list[tuple[list[int], list[int]]]
) -> None:
    """Everyone works at one of a few companies except some retired parents; first is manager."""
    workers = [p.id for p in society.people]
    retired = {parents[0] for parents, _ in families[::3] if parents}
    workers = [w for w in workers if w not in retired]
    rng.shuffle(workers)
    staff: dict[str, list[int]] = {c: [] for c in COMPANIES}
    for i, w in enumerate(workers):
        company = COMPANIES[i % len(COMPANIES)]
        staff[company].append(w)
        society.employer[w] = company
    for members in staff.values():
        manager, team = members[0], members[1:]
        for m in team:
            society.link(m, manager, "manager", "coworker")
        for a, b in combinations(team, 2):
            society.link(a, b, "coworker", "coworker")
