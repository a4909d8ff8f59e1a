"""Turning seeds (where data comes from) into exec tasks (one URL to fetch each), once
(``expand``) or on their schedules (``registry``, ``schedule``, ``seeder``)."""
