"""The one Ray adapter: every Ray and Ray Tune call of the project (importing it imports Ray; call
``sweep.orchestrate.cluster_env.ray_environment`` first)."""

from sweep.orchestrate.ray.start import start_ray, stop_ray, trial_resources
from sweep.orchestrate.ray.tuner import run_again, run_sweep

__all__ = ["run_again", "run_sweep", "start_ray", "stop_ray", "trial_resources"]
