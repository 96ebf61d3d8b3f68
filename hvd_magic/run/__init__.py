"""The notebook's supervision of one run: launch, watch, diagnose, retry, and the files ranks send."""
