"""What tritongemm does to a model: `patch` (patch.py), the fusions of `fuse=True` (fuse.py) and
fp8's shared quantizations (fp8.py)."""
