"""What a notebook user calls: the magics, ``HorovodRunner``, ``TorchDistributor``, and the capture of a
cell or function into a payload."""
