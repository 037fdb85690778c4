"""Reporting: leaderboards built from MLflow runs (``rlbench board``).

The engine (trainer, backends, tasks, algorithms) never imports this package; it reads runs
only through MLflow, so what it reports is what was logged.

- :mod:`harness.report.board` - query, group runs into rows (one configuration each), write pages
- :mod:`harness.report.tables` - markdown and CSV tables
- :mod:`harness.report.stats` - intervals over seeds, paired differences, Holm's correction
- :mod:`harness.report.plots` - curves (one colour per algorithm on every board)
- :mod:`harness.report.mlflow_log` - each leaderboard logged as an MLflow run
"""
