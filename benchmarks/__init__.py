"""eqattn benchmarks: `python -m benchmarks [SUITE ...] [--quick] [--out DIR]`."""
