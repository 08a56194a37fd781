"""The one Ray adapter: every Ray, Ray Tune and Ray Jobs call of the project, for the Ray-free driver
(``sweep.orchestrate.driver``). ``env`` sets what Ray must see when it is imported and imports nothing of Ray; every
other module here imports Ray, so call ``env.ray_environment`` first. This face imports none of them."""
