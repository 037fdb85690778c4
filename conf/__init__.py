"""rlbench's Hydra configs (``config.yaml`` and the groups beside it), shipped as package data.

This file makes ``conf/`` an importable package so that a ``pip install`` (not only an editable
checkout) carries the YAML and :func:`harness.config.conf_dir` finds it through
``importlib.resources``. There is no code here: :data:`RLBENCH_CONF` marks the package as
rlbench's, so a different ``conf`` package earlier on ``sys.path`` (a project's own ``conf/``) is
never mistaken for it.
"""

RLBENCH_CONF = True
