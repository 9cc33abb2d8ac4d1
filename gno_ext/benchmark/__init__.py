"""The results tables of a source checkout: their definitions and runs (`tables`), running their
cells (`run`), their pages (`render`) and figures (`figures`), and the runtime results
(`runtime`). ``recipes/benchmark.py`` is the command over them."""
