"""Turning seeds (where data comes from) into exec tasks (one URL to fetch each), once
(``expand``) or on their schedules (``registry``, ``schedule``, ``seeder``).

- :mod:`.seed_lines`: JSON Lines of seeds, read with bounded memory, each one validated
- :mod:`.expand` / :mod:`.expand_types`: the one expansion engine (``scrapy seed-expand``,
  ``POST /dispatch``, the seeder), its options, rejections and counts
- :mod:`.seed_urls`, :mod:`.templates`, :mod:`.sitemap`: one seed to its URLs, by type
  (server-side fetches: :mod:`.fetch`, bounded by :mod:`.deadline`, to the addresses
  :mod:`.addresses` allows)
- :mod:`.schedule`, :mod:`.cron`, :mod:`.adapt`: a seed's schedule, cron fire times, when it
  runs next (adaptive intervals, failing seeds backing off)
- :mod:`.registry` / :mod:`.records`: the seed registry in Redis and a seed read back
- :mod:`.seeder` / :mod:`.runner`: the long-running seeder and running it as a process
- :mod:`.yields`: the new URLs workers found per seed (the yield that adapts intervals)

See docs/seeding.md.
"""
