"""Stock-vs-fast checks: AccuracyParityHook (runtime); the parity recorder, report and runner (tooling, loaded by tools/parity.py)."""
