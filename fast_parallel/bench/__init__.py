"""Tooling: what ``tools/benchmark.py`` and the tests measure and make.

- :mod:`~fast_parallel.bench.datapath`, :mod:`~fast_parallel.bench.report`,
  :mod:`~fast_parallel.bench.plot`: the data path, stock vs fast (main
  process per batch, collate, transfer), its report and charts;
- :mod:`~fast_parallel.bench.modes`: ``--ops`` and ``--train`` dispatch;
- :mod:`~fast_parallel.bench.presets`: the configs it runs and how to point
  them at a data folder;
- :mod:`~fast_parallel.bench.ops`, :mod:`~fast_parallel.bench.opcount`:
  operations dispatched per training iteration (``--ops``);
- :mod:`~fast_parallel.bench.train_time`: full training iterations, timed in
  fresh processes, arms ``stock``, ``stock+pin_memory`` and ``fast``
  (``--train``);
- :mod:`~fast_parallel.bench.synthetic`,
  :mod:`~fast_parallel.bench.sample_data`: batches and sample data sets
  (``tools/make_sample_data.py``; ``docs/sample_data.md``).

``import fast_parallel`` loads none of them.
"""
