"""The one Ray adapter: every Ray, Ray Tune and Ray Jobs call of the project, for the Ray-free driver
(``sweep.orchestrate.driver``). Importing it imports Ray: call ``sweep.orchestrate.cluster_env.ray_environment``
first."""

from sweep.orchestrate.ray.start import start_ray, stop_ray, trial_resources
from sweep.orchestrate.ray.tuner import TuneCluster, cluster

__all__ = ["TuneCluster", "cluster", "start_ray", "stop_ray", "trial_resources"]
