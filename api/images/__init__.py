"""What a run says of its image (``fields``) and where a run may take it from (``sources``);
the run's container is started by ``api.runs.environment``, its calls pinned by
``api.calls.pins``."""
