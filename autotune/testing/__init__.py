"""Instruments for tests and benchmarks, shipped as ``torch.testing`` is: truth profiles of hardware that is not
here (:mod:`autotune.testing.simulate`) drive the real measurement, search and decision code on a fake clock."""
