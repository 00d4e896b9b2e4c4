"""Root-only emulator: a Mininet network shaped like a topology, and tools on it.

``emulator.net.emulation.Emulation`` builds and owns the network; ``python -m
emulator`` is the command line (``check``, ``clean``). Nothing in
``spiderflow`` imports this package.
"""
