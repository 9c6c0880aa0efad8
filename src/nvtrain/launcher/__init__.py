"""``nvtrain run``: where this pod stands, the ft_launcher plan, and supervision.

Nothing here imports torch or NVRx: ft_launcher runs as a child process.
"""
