"""The built-in in-context example pools: grade-school, competition and olympiad-style problems.

Every problem comes from a template written for propel, with its numbers drawn from a seeded RNG and
its answer computed by code (by brute force where that is the obvious check), so every answer is
verified by construction. Users can bring their own pools as JSONL or parquet (see ``load_pool``).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

Template = Callable[[random.Random], tuple[str, object]]


def _answer(value: object) -> str:
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    return str(value)


# -- grade school ---------------------------------------------------------------------------------


def _shop(r):
    n, p, paid = r.randint(3, 9), r.randint(2, 12), 100
    return (
        f"Mia buys {n} notebooks at ${p} each and pays with a ${paid} bill. How much change does she get, in dollars?",
        paid - n * p,
    )


def _train(r):
    speed, hours = r.choice([40, 45, 50, 60, 72, 80]), r.randint(2, 6)
    return f"A train travels at {speed} miles per hour for {hours} hours. How many miles does it travel?", speed * hours


def _apples(r):
    boxes, per, eaten = r.randint(3, 8), r.randint(6, 15), r.randint(2, 9)
    return (
        f"A farmer packs {boxes} boxes with {per} apples each, then his children eat {eaten} apples. "
        "How many apples are left?"
    ), boxes * per - eaten


def _ages(r):
    child, gap, years = r.randint(4, 12), r.randint(20, 35), r.randint(2, 10)
    return (
        f"Sam is {child} years old and his mother is {gap} years older. "
        f"What will the sum of their ages be in {years} years?"
    ), 2 * child + gap + 2 * years


def _percent(r):
    price, off = r.choice([40, 60, 80, 120, 150, 200, 250]), r.choice([10, 15, 20, 25, 30, 40])
    return f"A jacket costs ${price}. It is on sale for {off}% off. What is the sale price in dollars?", Fraction(
        price * (100 - off), 100
    )


def _share(r):
    friends, each, total_extra = r.randint(3, 7), r.randint(4, 12), r.randint(1, 5)
    total = friends * each + total_extra
    return (
        f"{total} stickers are shared equally among {friends} friends, and the stickers that are left over "
        "go to the teacher. How many stickers does the teacher get?"
    ), total % friends


def _garden(r):
    length, width = r.randint(5, 20), r.randint(3, 12)
    return (
        f"A rectangular garden is {length} meters long and {width} meters wide. How many meters of fence go around it?",
        2 * (length + width),
    )


def _savings(r):
    week, weeks, cost = r.randint(5, 15), r.randint(4, 10), r.randint(20, 60)
    return (
        f"Lena saves ${week} every week for {weeks} weeks and then spends ${cost} on a game. "
        "How many dollars does she have left?"
    ), week * weeks - cost


def _pages(r):
    pages, per_day = r.randint(120, 400), r.randint(15, 40)
    return (
        f"A book has {pages} pages. Omar reads {per_day} pages a day. How many days does he need to finish it?",
        math.ceil(pages / per_day),
    )


def _minutes(r):
    start_h, start_m, dur = r.randint(1, 10), r.choice([0, 15, 30, 45]), r.randint(35, 170)
    end = start_h * 60 + start_m + dur
    return (
        f"A movie starts at {start_h}:{start_m:02d} and lasts {dur} minutes. "
        "How many minutes past the hour does it end?"
    ), end % 60


def _coins(r):
    q, d, n = r.randint(2, 9), r.randint(1, 9), r.randint(1, 9)
    return f"Ana has {q} quarters, {d} dimes and {n} nickels. How many cents does she have?", 25 * q + 10 * d + 5 * n


def _recipe(r):
    cups, servings, wanted = r.randint(2, 5), r.choice([4, 6, 8]), r.choice([12, 16, 24])
    return (
        f"A recipe uses {cups} cups of flour for {servings} servings. How many cups of flour are needed for "
        f"{wanted} servings?"
    ), Fraction(cups * wanted, servings)


def _average(r):
    scores = [r.randint(60, 100) for _ in range(4)]
    target = r.randint(75, 90)
    needed = 5 * target - sum(scores)
    return (
        f"Kai scored {', '.join(map(str, scores))} on four tests. What must he score on the fifth test for "
        f"his average over five tests to be exactly {target}?"
    ), needed


def _bus(r):
    start, off, on = r.randint(20, 45), r.randint(3, 12), r.randint(2, 15)
    return (
        f"A bus has {start} passengers. At the first stop {off} get off and {on} get on; at the second stop "
        f"{off} get off again. How many passengers are on the bus now?"
    ), start - 2 * off + on


GRADE_SCHOOL: list[Template] = [
    _shop,
    _train,
    _apples,
    _ages,
    _percent,
    _share,
    _garden,
    _savings,
    _pages,
    _minutes,
    _coins,
    _recipe,
    _average,
    _bus,
]

# -- competition ----------------------------------------------------------------------------------


def _divisors(r):
    n = r.choice([72, 96, 120, 180, 210, 360, 420, 504, 720, 840])
    return f"How many positive divisors does {n} have?", sum(n % d == 0 for d in range(1, n + 1))


def _power_mod(r):
    a, b, m = r.randint(2, 9), r.randint(20, 99), r.choice([7, 9, 11, 13, 100])
    return f"What is the remainder when ${a}^{{{b}}}$ is divided by ${m}$?", pow(a, b, m)


def _arith_series(r):
    a, d, n = r.randint(1, 9), r.randint(2, 7), r.randint(10, 30)
    return f"Find the sum of the first {n} terms of the arithmetic sequence {a}, {a + d}, {a + 2 * d}, ...", n * (
        2 * a + (n - 1) * d
    ) // 2


def _choose(r):
    n, k = r.randint(6, 12), r.randint(2, 4)
    return f"In how many ways can a committee of {k} people be chosen from {n} people?", math.comb(n, k)


def _dice(r):
    target = r.randint(4, 10)
    hits = sum(a + b == target for a in range(1, 7) for b in range(1, 7))
    return f"Two fair six-sided dice are rolled. What is the probability that the sum is {target}?", Fraction(hits, 36)


def _linear_system(r):
    x, y = r.randint(-5, 9), r.randint(-5, 9)
    a, b, c, d = r.randint(1, 5), r.randint(1, 5), r.randint(1, 5), -r.randint(1, 5)
    return (f"If ${a}x + {b}y = {a * x + b * y}$ and ${c}x {d:+d}y = {c * x + d * y}$, what is $x + y$?"), x + y


def _gcd_lcm(r):
    a, b = r.randint(12, 90), r.randint(12, 90)
    return f"What is the sum of the greatest common divisor and the least common multiple of {a} and {b}?", math.gcd(
        a, b
    ) + math.lcm(a, b)


def _digit_sum_power(r):
    n = r.randint(10, 40)
    return f"What is the sum of the digits of $2^{{{n}}}$?", sum(map(int, str(2**n)))


def _triangle_area(r):
    pts = [(r.randint(-6, 6), r.randint(-6, 6)) for _ in range(3)]
    (x1, y1), (x2, y2), (x3, y3) = pts
    area = Fraction(abs(x1 * (y2 - y3) + x2 * (y3 - y1) + x3 * (y1 - y2)), 2)
    if area == 0:
        return _triangle_area(r)
    return f"What is the area of the triangle with vertices {pts[0]}, {pts[1]} and {pts[2]}?", area


def _vieta(r):
    p, q = r.randint(-9, 9), r.randint(-9, 9)
    return f"What is the sum of the squares of the roots of $x^2 {-(p + q):+d}x {p * q:+d} = 0$?", p * p + q * q


def _last_two_digits(r):
    a, n = r.choice([3, 7, 13, 17]), r.randint(20, 200)
    return f"What are the last two digits of ${a}^{{{n}}}$? Give the number they form.", pow(a, n, 100)


def _multiples(r):
    n, a, b = r.choice([100, 200, 500, 1000]), r.choice([3, 4, 6]), r.choice([5, 7, 10])
    return f"How many positive integers not exceeding {n} are divisible by {a} or by {b}?", sum(
        1 for k in range(1, n + 1) if k % a == 0 or k % b == 0
    )


def _geometric(r):
    a, q, n = r.randint(1, 5), r.choice([2, 3]), r.randint(5, 9)
    return "What is the sum $" + " + ".join(str(a * q**i) for i in range(n)) + "$?", sum(a * q**i for i in range(n))


def _handshakes(r):
    n = r.randint(8, 30)
    return (
        f"At a party of {n} people, everyone shakes hands with everyone else exactly once. How many handshakes happen?",
        n * (n - 1) // 2,
    )


COMPETITION: list[Template] = [
    _divisors,
    _power_mod,
    _arith_series,
    _choose,
    _dice,
    _linear_system,
    _gcd_lcm,
    _digit_sum_power,
    _triangle_area,
    _vieta,
    _last_two_digits,
    _multiples,
    _geometric,
    _handshakes,
]

# -- olympiad-style -------------------------------------------------------------------------------


def _coprime_pairs(r):
    n = r.randint(8, 20)
    count = sum(math.gcd(a, b) == 1 for a in range(1, n + 1) for b in range(1, n + 1))
    return f"How many ordered pairs $(a, b)$ with $1 \\le a, b \\le {n}$ satisfy $\\gcd(a, b) = 1$?", count


def _trailing_zeros(r):
    n = r.randint(100, 999)
    return f"How many zeros does ${n}!$ end with?", sum(n // 5**k for k in range(1, 6))


def _no_adjacent_ones(r):
    n = r.randint(8, 16)
    count = sum("11" not in "".join(bits) for bits in itertools.product("01", repeat=n))
    return f"How many binary strings of length {n} contain no two consecutive 1s?", count


def _quadratic_divisible(r):
    n, m = r.choice([100, 200, 300]), r.choice([6, 10, 12, 15])
    count = sum((k * k + k) % m == 0 for k in range(1, n + 1))
    return f"For how many positive integers $n \\le {n}$ is $n^2 + n$ divisible by {m}?", count


def _subset_sums(r):
    n, k = r.randint(6, 10), r.choice([3, 4, 5])
    count = sum(sum(s) % k == 0 for size in range(n + 1) for s in itertools.combinations(range(1, n + 1), size))
    return (
        f"How many subsets of $\\{{1, 2, \\ldots, {n}\\}}$ (including the empty set) have a sum divisible by {k}?",
        count,
    )


def _compositions(r):
    n, cap = r.randint(10, 18), r.randint(4, 7)
    count = sum(1 for x in range(1, cap + 1) for y in range(1, cap + 1) if 1 <= n - x - y <= cap)
    return (
        f"How many ordered triples of positive integers $(x, y, z)$ with each at most {cap} satisfy $x + y + z = {n}$?",
        count,
    )


def _fib_mod(r):
    n, m = r.randint(50, 300), r.choice([7, 10, 11, 13])
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return (
        f"Let $F_1 = F_2 = 1$ and $F_{{k+2}} = F_{{k+1}} + F_k$. What is the remainder when $F_{{{n}}}$ is divided by {m}?",
        a % m,
    )


def _not_square_cube(r):
    n = r.choice([200, 500, 1000, 2000])
    count = sum(1 for k in range(1, n + 1) if math.isqrt(k) ** 2 != k and round(k ** (1 / 3)) ** 3 != k)
    return f"How many integers from 1 to {n} are neither perfect squares nor perfect cubes?", count


def _smallest_multiple(r):
    m = r.randint(7, 13)
    return f"What is the smallest positive integer divisible by every integer from 1 to {m}?", math.lcm(
        *range(1, m + 1)
    )


def _digit_condition(r):
    s = r.randint(5, 15)
    count = sum(sum(map(int, str(k))) == s for k in range(100, 1000))
    return f"How many three-digit positive integers have digits that sum to {s}?", count


def _lattice_circle(r):
    rr = r.randint(3, 9)
    count = sum(x * x + y * y <= rr * rr for x in range(-rr, rr + 1) for y in range(-rr, rr + 1))
    return f"How many points $(x, y)$ with integer coordinates satisfy $x^2 + y^2 \\le {rr * rr}$?", count


def _derangements(r):
    n = r.randint(4, 8)
    count = sum(all(p[i] != i for i in range(n)) for p in itertools.permutations(range(n)))
    return (
        f"In how many ways can {n} letters be put into their {n} addressed envelopes so that no letter is in its own envelope?",
        count,
    )


def _totient_sum(r):
    n = r.randint(10, 40)
    count = sum(sum(math.gcd(k, m) == 1 for k in range(1, m + 1)) for m in range(1, n + 1))
    return (
        f"Let $\\varphi$ be Euler's totient function. What is $\\varphi(1) + \\varphi(2) + \\cdots + \\varphi({n})$?",
        count,
    )


def _min_n_power(r):
    base, m = r.choice([2, 3, 5]), r.choice([7, 11, 13, 17, 19])
    n = next(k for k in range(1, m) if pow(base, k, m) == 1)
    return f"What is the smallest positive integer $n$ such that ${base}^n - 1$ is divisible by {m}?", n


OLYMPIAD: list[Template] = [
    _coprime_pairs,
    _trailing_zeros,
    _no_adjacent_ones,
    _quadratic_divisible,
    _subset_sums,
    _compositions,
    _fib_mod,
    _not_square_cube,
    _smallest_multiple,
    _digit_condition,
    _lattice_circle,
    _derangements,
    _totient_sum,
    _min_n_power,
]

BUILTIN_POOLS = {"grade_school": GRADE_SCHOOL, "competition": COMPETITION, "olympiad": OLYMPIAD}


def builtin_pool(name: str, per_template: int = 3, seed: int = 2026) -> list[dict[str, str]]:
    """The built-in pool ``name``: ``per_template`` problems from each template, reproducible."""
    rng = random.Random(f"{name}-{seed}")
    problems, seen = [], set()
    for template in BUILTIN_POOLS[name]:
        made = 0
        while made < per_template:
            problem, answer = template(rng)
            if problem not in seen:
                seen.add(problem)
                problems.append({"problem": problem, "answer": _answer(answer)})
                made += 1
    return problems


def load_pool(path: str | Path, problem_key: str = "problem", answer_key: str = "answer") -> list[dict[str, str]]:
    """A user's pool from JSONL or parquet (e.g. GSM8K or MATH-500 exports): problem and answer columns."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"reading {path} needs pyarrow: pip install pyarrow") from None
        rows = pq.read_table(path).to_pylist()
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    missing = [i for i, row in enumerate(rows) if problem_key not in row or answer_key not in row]
    if missing:
        raise ValueError(f"{path}: rows {missing[:5]} lack '{problem_key}' or '{answer_key}'")
    return [{"problem": str(row[problem_key]), "answer": str(row[answer_key])} for row in rows]
