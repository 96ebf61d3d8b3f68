"""Everything that runs inside a rank process (and nothing that runs elsewhere).

A rank imports only this folder, ``hvd_magic.protocol``, ``hvd_magic.errors`` and
``hvd_magic.data``: no IPython, no pyspark, no widgets (``tests/test_house.py`` holds it)."""
