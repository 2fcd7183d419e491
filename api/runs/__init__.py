"""A run's workspace and environment on the fleet: files in and out, commands, and the run's
container started from its image."""
