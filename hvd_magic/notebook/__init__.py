"""What a notebook user calls: the magics, ``HorovodRunner`` and ``TorchDistributor``."""
