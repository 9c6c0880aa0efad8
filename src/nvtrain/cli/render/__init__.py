"""Terminal output of the ``nvtrain`` commands: the only package that imports rich.

One module per thing rendered: ``console`` (the shared consoles and ``visible``/``escape`` for
text from outside), ``findings`` (findings, errors and warnings), ``settings`` (the effective
policy of ``validate``), ``events`` (what ``nvtrain run`` shows while it runs), ``tuning``
(``tune-interval``), ``report`` (``nvtrain report``), ``init`` and ``manifest`` (the files those
commands wrote). rich is imported on first use: a command writing to a pipe or a log (CI, pod
logs) prints plain lines and never loads it, which keeps its start-up short. Import the module
a command needs, not this package's (empty) namespace.
"""
