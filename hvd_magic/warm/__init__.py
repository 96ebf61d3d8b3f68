"""Warm ranks: ranks forked from a process that imported the framework once, and everything that
makes them, on whichever side it runs (``docs/architecture.md``, "warm/")."""
