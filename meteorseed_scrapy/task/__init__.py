"""The task model: seed and exec tasks, their validation, ids, lanes and message format."""
