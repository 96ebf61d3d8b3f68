"""A run's options: declared once (``table``), each value checked (``parse``), and made into the
``RunOptions`` a run is told (``run_options``), a loop over the table."""

from hvd_magic.options.option import Option
from hvd_magic.options.parse import OptionError
from hvd_magic.options.run_options import RunOptions, cell_options, make_options
from hvd_magic.options.table import OPTIONS

__all__ = ["OPTIONS", "Option", "OptionError", "RunOptions", "cell_options", "make_options"]
