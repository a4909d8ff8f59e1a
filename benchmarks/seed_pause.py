"""Pause of a seed with four workers: time from the command to the last request of the seed that
reaches the site (measured at the site), over rounds.

    .venv/bin/python benchmarks/seed_pause.py [--rounds 3] [--per-seed 150]

Each round: a throwaway Redis, the demo site, two seeds of 150 slow pages (300 ms) of one site
enqueued alternately, four workers of 8 requests each; once 20 items are stored, ``meteorseed
seeds pause target``; once nothing of ``target`` is left to start (its tasks parked or stored),
``seeds resume target``, and every task of both seeds must be stored (nothing lost). The rig is
``tests/seed_control_rig.py`` (the same as tests/test_seed_control_fleet.py). Each round prints
the time from the command to the last request of ``target`` at the site, the requests of it
after the command (started before the workers read the hold), and the command's own time; the
last line is the median figure. The product's bound is ``BOUND_S`` (2 s) after the hold exists.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402
from tests.seed_control_rig import BOUND_S, pause_round  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-seed", type=int, default=150)
    args = parser.parse_args()
    figures = []
    for n in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="meteorseed-seed-pause-") as tmp, \
                RedisServer() as server:
            got = pause_round(Path(tmp), server.url, f"bench{n}", per_seed=args.per_seed)
        figures.append(got.last_request_s)
        print(f"round {n + 1}: last request {got.last_request_s:.2f} s after the command "
              f"({got.requests_after} after it, {got.after_bound} beyond the bound; command "
              f"{got.command_s:.2f} s; the other seed {got.other_while} meanwhile)", flush=True)
    print(f"seed pause, 4 workers x 8: last request at the site {statistics.median(figures):.2f} s"
          f" after the command (median of {len(figures)}; max {max(figures):.2f} s; bound "
          f"{BOUND_S} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
