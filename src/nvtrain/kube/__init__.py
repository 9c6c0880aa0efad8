"""The Kubernetes side of nvtrain: the manifests of a policy (``nvtrain manifest``), their checks
(``nvtrain validate --manifest``), monitoring objects, and the starter files of ``nvtrain init``.

Rendering: ``options`` (the options, declared once, with their command-line flags),
``option_checks``, ``sizing``, ``objects``, ``jobset``, ``yaml_io``, and ``manifest`` (``render``
and ``manifest_from_file``), over ``qos``, ``podsecurity``, ``scheduling``, ``podextras``,
``monitoring``, ``alerts`` and ``trainer_runtime``. Checking: ``yaml_positions`` (YAML read with
positions), ``manifest_checker``, ``control_checks``, ``workload_checks`` and ``manifest_checks``
(against the policy), ``ref_pods``, ``ref_objects``, ``ref_container`` and ``manifest_refs``
(references between the objects). Kubernetes names and DNS-label rules are
``nvtrain.kubenames``', shared with the launcher; nothing here imports ``nvtrain.launcher``.
"""
