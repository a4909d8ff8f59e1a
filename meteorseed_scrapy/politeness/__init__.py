"""Fleet-wide politeness per site: token-bucket quota, concurrency leases, pauses, backoff."""
