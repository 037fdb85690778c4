"""Reporting: leaderboards built from MLflow runs (``rlbench board``).

The engine (trainer, backends, tasks, algorithms) never imports this package
(``tests/report/test_report_layout.py``); it reads runs only through MLflow, so what a board
reports is what was logged.

- :mod:`harness.report.board` - the build: query, rows, statistics, pages, MLflow run, export
- :mod:`harness.report.collect` - runs into rows, one configuration each; duplicates; selection
- :mod:`harness.report.config` - board configs (``conf/board/*.yaml``)
- :mod:`harness.report.stats` - Student-t intervals over seeds, paired differences
- :mod:`harness.report.analysis` / :mod:`harness.report.verdict` - the declared plan: the
  seed-blocked test of the primary comparisons, their power, descriptive-only boards
- :mod:`harness.report.budget` - quality measured at a common budget of tokens generated
- :mod:`harness.report.tables` / :mod:`harness.report.page` - markdown and CSV
- :mod:`harness.report.plots` - curves, one colour per algorithm on every board
- :mod:`harness.report.provenance` - checkout state, reproduce line, export of the runs
- :mod:`harness.report.mlflow_log` - each leaderboard logged as an MLflow run
"""
