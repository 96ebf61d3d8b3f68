"""Live rank sessions (``%horovod start``): ranks that keep their state across cells."""
