"""A run's own environment from an OCI image: one container per run, alive for the run, on the
sandbox worker that started it.

The parts: ``reference`` (what an image reference may be, and how skopeo reads it), ``fetch``
(skopeo resolves a digest and copies the image), ``unpack`` (one layer, checked, in overlayfs's
form), ``layer_store`` (each layer once per host, shared by its images), ``cache`` (the worker's
images, bounded, least recently used first), ``rootfs`` (an image's files read as the image sees
them), ``spec`` (the OCI configuration of a box and of each call), ``inside`` (who runs in a
box, where the workspace goes, its first process), ``mounts`` (the image's layers under a layer
of the run's own, through idmapped mounts), ``runtime`` (runc, crun or runsc by their command
line), ``group`` (a box's control group: each call's usage, its leftovers killed), ``boxes`` (a
run's box started, found, ended), ``calls`` (one command in a box), ``seed`` (the image's
WorkingDir brought into the workspace), ``owner`` (the worker that holds a box, and its own
queue), ``sweep`` (what dead workers and ended runs left), ``here`` (this worker's boxes) and
``pinning`` (the worker's own queue, and its sweep, wired to Celery).

The tools build on these: ``worker.tools.commands`` runs a call's command in its run's box (or
on the worker's files), ``worker.tools.environment_service`` serves the start and end
operations. Nothing here imports the tools.
"""
