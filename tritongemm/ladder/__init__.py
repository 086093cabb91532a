"""The `triton.language` rungs of the ladder: naive -> grouped -> persistent, swap_ab for skinny
problems and stream_k (experimental) for tile counts that leave the last wave half empty.

Importing this package registers them with `tritongemm.registry`.
"""

from tritongemm.ladder import grouped, naive, persistent, stream_k, swap_ab  # noqa: F401
