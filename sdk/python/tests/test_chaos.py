"""`retrace record --chaos SEED` shuffles an SDK program's deliveries: the run's seed reaches the
daemon's session (RETRACE_CHAOS_SEED for the program, `chaos_seed` on the run for the daemon),
whose bus picks at random among the messages deliverable at once. chaos_prog.py has four
senders post twelve messages before the receiver takes any. Shown here: with no seed the
receiver hears them in send order; seeds give other orders, and different seeds different ones;
one seed recorded twice gives the same order (the program posts from one thread and receives
only once every chaos delay has passed, so the seed alone decides); chaos never reorders one
sender's messages (the bus keeps per-sender order); and every chaos run replays exactly."""
import json
import sys
from pathlib import Path

import pytest

from test_sdk import retrace

HERE = Path(__file__).parent
PROG = [sys.executable, str(HERE / "chaos_prog.py")]
SEEDS = (1, 2, 3, 4)
SEND_ORDER = [f"s{i}:{n}" for n in range(3) for i in range(4)]


def record(home, *chaos):
    r = retrace(home, "record", "--json", *chaos, "--", *PROG)
    *printed, last = r.stdout.strip().splitlines()
    run = json.loads(last)["run"]
    return run, printed[-1].split()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{seed or None: (run id, order heard)}, and a second recording of the first seed."""
    home = tmp_path_factory.mktemp("chaos-home")
    out = {None: record(home)}
    for seed in SEEDS:
        out[seed] = record(home, "--chaos", str(seed))
    out["again"] = record(home, "--chaos", str(SEEDS[0]))
    return home, out


def test_without_a_seed_the_receiver_hears_the_send_order(runs):
    _, out = runs
    assert out[None][1] == SEND_ORDER


def test_seeds_shuffle_deliveries_and_the_run_names_its_seed(runs):
    home, out = runs
    orders = {seed: tuple(out[seed][1]) for seed in SEEDS}
    for order in orders.values():
        assert sorted(order) == sorted(SEND_ORDER), order  # every message heard once
    assert any(list(o) != SEND_ORDER for o in orders.values()), orders
    assert len(set(orders.values())) > 1, f"every seed gave the same order: {orders}"
    listed = {r["id"]: r for r in json.loads(retrace(home, "runs", "--json").stdout)}
    for seed in SEEDS:
        assert listed[out[seed][0]].get("chaos_seed") == seed, listed[out[seed][0]]


def test_the_same_seed_gives_the_same_order(runs):
    _, out = runs
    assert out["again"][1] == out[SEEDS[0]][1]


def test_chaos_keeps_each_senders_order(runs):
    _, out = runs
    for seed in SEEDS:
        heard = out[seed][1]
        for sender in ("s0", "s1", "s2", "s3"):
            mine = [h for h in heard if h.startswith(sender + ":")]
            assert mine == [f"{sender}:{n}" for n in range(3)], (seed, heard)


def test_each_chaos_run_replays_exactly(runs):
    home, out = runs
    for seed in SEEDS:
        run, heard = out[seed]
        r = retrace(home, "replay", run)
        assert r.stdout.strip().split() == heard, (seed, r.stdout, r.stderr)
        assert "ok: every step matched" in r.stderr, r.stderr
