"""Device adapters: pegaflow.device.cuda (torch, real GPUs) and pegaflow.device.sim
(numpy over the sim GPU's shared memory). Import the one you need; this package imports
neither torch nor numpy."""

from pegaflow.device.base import DeviceAdapter, TensorInfo, describe

__all__ = ["DeviceAdapter", "TensorInfo", "describe"]
