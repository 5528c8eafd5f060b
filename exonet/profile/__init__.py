"""Measured compute from a torch.profiler trace: what one training step of a real model costs, layer by layer.

``read_profile`` reads Kineto's Chrome-trace JSON (exonet.profile.kineto); ``measure`` lays its
timings onto a model's parameters, optionally at another depth or device (exonet.profile.layers).
``exonet.estimate(..., profile=...)`` replays them instead of 6·P·tokens at a guessed MFU;
``fit(profile=True)`` records such a trace of a run's own steps (exonet.profile.record).
"""

from exonet.profile.kineto import StepProfile, read_profile
from exonet.profile.layers import DEVICE_TFLOPS, MeasuredStep, measure

__all__ = ["DEVICE_TFLOPS", "MeasuredStep", "StepProfile", "measure", "read_profile"]
