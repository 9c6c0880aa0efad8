"""The built-in CPU demo job: a small model on synthetic data, 2 ranks, gloo.

Run by ``nvtrain run`` with the built-in demo policy (``python -m nvtrain.demo`` per worker).
"""
