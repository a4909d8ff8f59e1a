"""Helpers for tests, the demo and benchmarks: a throwaway Redis server and a local test site."""
