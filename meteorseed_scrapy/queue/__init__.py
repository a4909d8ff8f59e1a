"""Redis Streams plumbing: writing tasks, reading, acking and dead letters."""
