import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
except ImportError:  # the truth extra is not installed: its tests skip themselves
    torch = None
if torch is not None:
    # The CPU runs here are tiny: one thread. Several OpenMP threads per pytest-xdist worker
    # oversubscribe the cores and spin, slowing these tests tenfold or more.
    torch.set_num_threads(1)
