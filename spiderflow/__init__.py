"""SpiderFlow: topology-aware placement and parallelisation of LLM training across
geo-distributed GPU clusters (the planner, the cost model and the trace simulator).

The emulator that checks the cost model on real traffic is the separate
``emulator`` package (``pip install .[emulator]``, root to run).
"""

__version__ = "0.2.0"
