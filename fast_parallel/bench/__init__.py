"""What ``tools/benchmark.py`` measures beyond the data path.

- :mod:`~fast_parallel.bench.presets`: the configs it runs and how to point
  them at a data folder;
- :mod:`~fast_parallel.bench.ops`: operations dispatched per training
  iteration, stock vs fast (``--ops``);
- :mod:`~fast_parallel.bench.train_time`: full training iterations, timed in
  fresh processes, arms ``stock``, ``stock+pin_memory`` and ``fast``
  (``--train``).
"""
