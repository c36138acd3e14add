"""Stock-vs-fast checks.

``AccuracyParityHook`` (:mod:`fast_parallel.parity.accuracy`) is runtime:
``import fast_parallel`` registers it. The rest is tooling that
``tools/parity.py`` loads: :mod:`~fast_parallel.parity.recorder`,
:mod:`~fast_parallel.parity.report` and :mod:`~fast_parallel.parity.runner`.
"""
