"""nvtrain: a fault-tolerant launcher for distributed PyTorch training on Kubernetes.

The package is a library first; the ``nvtrain`` command (``nvtrain.cli``) is a thin layer over it.
Importing ``nvtrain`` never imports torch or NVIDIA Resiliency Extension.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
