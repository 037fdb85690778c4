"""The tiny agentic testbed: two-hop lookups over a small generated corpus, for a char-level
model on a CPU.

World: ``n_companies`` companies, each with its own founder; every founder has a manager (from a
pool of ``n_managers``) and a city (from ``n_cities``); every company also has a city (a
distractor: a query must name the relation it wants). All names are generated, ASCII, 3-4
letters, unique and not BM25 stop words. The corpus holds one sentence per fact::

    Zorb's founder is Ann.    Ann's manager is Bo.    Ann's city is Kel.    Zorb's city is Lom.

A question asks for a founder's manager or city: ``"Q: manager of founder of Zorb?\\n"``. Its
answer is in neither the question nor the first hop's result, so at least two searches are
needed; the reference completion (the warm-start trace) is one line (cut here)::

    <search>Zorb founder</search><result>Zorb's founder is Ann.</result>
    <search>Ann manager</search><result>Ann's manager is Bo.</result><answer>Bo</answer>

With ``searches: [0, 1, 2]`` the model must also decide how many searches a question needs:
each problem is given the first ``2 - need`` facts of its chain on a line before the question,
so it needs ``need`` searches (the default ``[2]`` gives none: every question needs two)::

    Zorb's founder is Ann.\nQ: manager of founder of Zorb?\n          -> one search ("Ann manager")
    Zorb's founder is Ann. Ann's manager is Bo.\nQ: manager of ...?\n -> answer directly

Needs are dealt round-robin by company, offset per relation (balanced, and never tied to the
relation asked), so the held-out split has every need. Searching anyway still finds the answer:
nothing but the call budget and the warm-start traces (which search exactly ``need`` times) says
not to, which is what lets tool calls per answer differ between methods. ``trace(...,
both_hops=True)`` searches both hops whatever the question gives (an over-searching warm start:
the tool-call testbed's positive control, ``task.tiny.warmstart_trace: both_hops``).

The results in the trace are produced by calling the task's own :class:`harness.tools.ToolEnv`
(a :class:`tasks.agentic_qa.tools.BM25Search` over this corpus returning the single best
sentence), so a warm-started model that issues the same queries gets the same results back.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from harness.tools import ToolEnv
from harness.types import Example
from tasks.agentic_qa.tools import Passage

RELATIONS = ("manager", "city")  # the second hop; the first is always "founder"
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
RESERVED = {"founder", "manager", "city", "of", "is", "q", *RELATIONS}


@dataclass
class World:
    """The generated facts (ordered, deterministic for a seed)."""

    founder: dict[str, str]  # company -> founder
    manager: dict[str, str]  # founder -> manager
    person_city: dict[str, str]  # founder -> city
    company_city: dict[str, str]  # company -> city (distractor)

    def passages(self) -> list[Passage]:
        facts = []
        for company, person in self.founder.items():
            facts.append(fact(company, "founder", person))
            facts.append(fact(person, "manager", self.manager[person]))
            facts.append(fact(person, "city", self.person_city[person]))
            facts.append(fact(company, "city", self.company_city[company]))
        return [Passage(f"t{i}", "", text) for i, text in enumerate(facts)]


def fact(subject: str, relation: str, value: str) -> str:
    """One corpus sentence (also what a question gives when it needs fewer searches)."""
    return f"{subject}'s {relation} is {value}."


def _names(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct capitalised CVC / CVCV names (no stop words: bm25s's list has none
    of this shape but 'not' and 'was', and they are skipped)."""
    from bm25s.stopwords import STOPWORDS_EN

    pool = ["".join(p) for p in itertools.product(CONSONANTS, VOWELS, CONSONANTS)]
    pool += ["".join(p) for p in itertools.product(CONSONANTS, VOWELS, CONSONANTS, VOWELS)]
    pool = [n for n in pool if n not in STOPWORDS_EN and n not in RESERVED]
    if count > len(pool):
        raise ValueError(f"tiny agentic_qa: {count} names asked for, {len(pool)} exist")
    return [n.capitalize() for n in rng.sample(pool, count)]


def make_world(n_companies: int, n_managers: int, n_cities: int, seed: int) -> World:
    rng = random.Random(seed)
    names = _names(rng, 2 * n_companies + n_managers + n_cities)
    companies = names[:n_companies]
    founders = names[n_companies : 2 * n_companies]
    managers = names[2 * n_companies : 2 * n_companies + n_managers]
    cities = names[2 * n_companies + n_managers :]
    return World(
        founder=dict(zip(companies, founders)),
        manager={p: rng.choice(managers) for p in founders},
        person_city={p: rng.choice(cities) for p in founders},
        company_city={c: rng.choice(cities) for c in companies},
    )


def prompt(relation: str, company: str) -> str:
    return f"Q: {relation} of founder of {company}?\n"


SEARCHES = (0, 1, 2)  # how many searches a question can need (facts given: 2 - need)


def problems(world: World, relations: tuple[str, ...] | list[str] = RELATIONS,
             searches: tuple[int, ...] | list[int] = (2,)) -> list[Example]:
    """One problem per (company, relation), in a deterministic order; company i's j-th relation
    needs ``searches[(i + j) % len(searches)]`` searches (dealt by company with an offset per
    relation, so a need is never tied to a relation), the facts it does not need to look up
    given on a line before the question."""
    if not searches or set(searches) - set(SEARCHES):
        raise ValueError(f"task.tiny.searches={list(searches)}: give a non-empty list drawn from "
                         f"{list(SEARCHES)}")
    out = []
    for i, (company, person) in enumerate(world.founder.items()):
        for j, rel in enumerate(relations):
            if rel not in RELATIONS:
                raise ValueError(f"tiny agentic_qa: relation {rel!r}; valid: {RELATIONS}")
            answer = world.manager[person] if rel == "manager" else world.person_city[person]
            need = int(searches[(i + j) % len(searches)])  # by company, offset per relation
            facts = [fact(company, "founder", person), fact(person, rel, answer)]
            given = " ".join(facts[: 2 - need])
            hops = [f"{company} founder", f"{person} {rel}"]
            out.append(Example(
                id=f"tiny/{company}/{rel}", prompt=(given + "\n" if given else "")
                + prompt(rel, company),
                answer={"answers": [answer]},
                meta={"dataset": "tiny", "company": company, "relation": rel,
                      "bridge": person, "queries": hops[2 - need:], "hops": hops,
                      "searches_needed": need},
            ))
    return out


def trace(example: Example, env: ToolEnv, both_hops: bool = False) -> str:
    """The reference multi-turn completion: each planned search (none for a question that
    gives both facts; with ``both_hops`` both hops' searches, even of facts the question gives),
    the result the tool env returns for it (exactly as the rollout will insert it), then the
    answer."""
    parts = []
    for query in example.meta["hops" if both_hops else "queries"]:
        result, _ = env.call("search", query)
        parts.append(f"<search>{query}</search>{result}")
    return "".join(parts) + f"<answer>{example.answer['answers'][0]}</answer>"
