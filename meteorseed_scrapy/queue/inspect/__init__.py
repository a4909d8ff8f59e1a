"""Reading a namespace back: what waits where, and where one task is.

- :mod:`.status`: the one reader behind ``meteorseed status``, ``GET /status`` and the metrics
- :mod:`.task_query`: a task lookup's query (task id or canonical URL) and answer
- :mod:`.task_places`: the Redis replies about a task turned into its places
- :mod:`.task_state`: where a task is (``meteorseed task``, ``GET /tasks``, the console)
"""
