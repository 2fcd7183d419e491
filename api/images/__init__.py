"""A run's image, from the orchestrator's side: the run's container started on a sandbox worker
(``environment``), and the run's calls kept on that worker's queue (``pins``)."""
