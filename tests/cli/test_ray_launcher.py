"""hydra/launcher=ray (issue 21 item 5): a 2-cell tiny sweep on a local Ray head that the sweep
starts on 127.0.0.1 (``ray.init(address="local")``, no cluster needed) lands in one MLflow
experiment exactly as with joblib (tests/engine/test_resume.py), one FINISHED run per cell."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import QUIET_RUN, rlbench

pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install -e '.[dev]'")


@pytest.mark.slow
def test_ray_sweep_lands_in_one_experiment_like_joblib(tmp_path, cli_env, tiny_model_path):
    # tiny_model_path: the warm start is built (and cached) before the cells, as in the joblib test
    env = {**cli_env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}
    out = rlbench("sweep", "algorithm=grpo", "seed=0,1", *QUIET_RUN, "trainer.steps=1",
                  "trainer.eval_every=0", "trainer.status_every=0",
                  "tracking.experiment=launchers", "hydra/launcher=ray",
                  "hydra.launcher.ray.init.address=local",
                  "+hydra.launcher.ray.init._node_ip_address=127.0.0.1",
                  "+hydra.launcher.ray.init.num_cpus=2",
                  "+hydra.launcher.ray.init.include_dashboard=false",
                  env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2/2 cells" in out.stderr
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    names = [e.name for e in client.search_experiments()]
    assert "launchers" in names
    runs = client.search_runs([client.get_experiment_by_name("launchers").experiment_id])
    assert sorted(r.data.tags["rlbench.seed"] for r in runs) == ["0", "1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert len({r.data.tags["rlbench.config_hash"] for r in runs}) == 2
