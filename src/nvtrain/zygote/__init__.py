"""Warm starts: replacement workers forked from an interpreter that has torch imported already.

``nvtrain run`` with ``[job] warm_start = true`` starts one server per pod (``server``) that
imports torch, NVRx, nvtrain's worker library and the training script's own imports, then waits
on a Unix socket; CUDA is never initialised there. ft_launcher's worker command becomes the
client (``python -m nvtrain.zygote.client SCRIPT ARGS``), a small program of the standard
library only: it hands the server its argv, environment, working directory and its stdin,
stdout and stderr, and the server forks a worker that runs the script with them. To ft_launcher
the client *is* the worker: it passes on every signal it gets, and exits with the worker's exit
code (or dies of the worker's signal). When the client dies (SIGKILL), the server kills its
worker. When the server dies, its workers run on: each keeps the server's end of its client's
connection and writes its own status there as it ends, which its client takes. The server binds
its socket before it imports anything: a client that comes during the imports (the pod's first
workers) waits for them, so a pod imports torch once, not once per worker. When the server is
not there (gone, or it refused to serve), the client runs the script itself, as a cold start.

Only this user may use the socket: it is made at mode 0600 whatever the umask, in a folder that
must be this user's alone (else the server refuses to serve), and the server closes any
connection whose peer (``SO_PEERCRED``) is another user's before it reads anything.
"""

ENV = "NVTRAIN_ZYGOTE"
"""The server's socket path, in the workers' environment."""

__all__ = ["ENV"]
