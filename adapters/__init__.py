"""Dataset adapters (installed as ``gno_ext.adapters``).

The Well, PDEBench and custom adapters arrive with the adapters issue; this package exists now
so that the installed layout (``gno_ext.adapters`` from the top-level ``adapters/`` folder) is
fixed from the start.
"""
