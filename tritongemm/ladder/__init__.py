"""The ladder's rungs, one module each: rungs 1-3, 8 and 10 in `triton.language` (naive ->
grouped -> persistent, swap_ab for skinny problems, stream_k), rungs 4-7, 9 and 11-13 in Gluon
(11 is rung 9's module with two consumers, 12 runs rungs 6 and 7 on two parts of C, 13 is rung
6 on tiles of two parts). Each module reads top to bottom: configs, kernel, `plan`, `launch`;
core/registry.py describes them, dispatch/ chooses among them.
"""
