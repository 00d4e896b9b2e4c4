"""``emulator calibrate`` and ``emulator report``: measure the emulated network, fit it, check the cost model.

- :mod:`emulator.calibrate.fit`: alpha-beta least squares per path and per collective (pure);
- :mod:`emulator.calibrate.opbench`: nccl-tests-style microbenchmarks with real collectives in the hosts;
- :mod:`emulator.calibrate.plans`: a fixed set of plans run alone, predicted before and after calibration;
- :mod:`emulator.calibrate.report`: ``report.md`` and its PNG figures from a run directory (no root).

Run-directory layout: docs/calibration.md.
"""
