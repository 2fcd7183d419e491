"""Every way the sandbox starts a command, in one folder, and what each one buys.

Where a command starts is chosen by what the machine gives (``layers.plan_for``) and by what is
ready. Two of the paths are there because a machine lacks something, the others because they are
faster, as measured by ``python -m bench.start_paths`` (``run_sandboxed 'true'`` in process as the
sandbox pool's root workers run it, p50 of 120 calls a path, one path taken away at a time; two
runs on a 2-core machine under a load of about 11, after a pause of 50 ms between calls, as an
agent's next command follows a model turn; back to back, the pool's thread has no time to make
the next launch and the three launch paths cost alike, 58-62 and 83-91 ms):

=====================================================  ==============  ======================
path                                                   p50 ms          kept because
=====================================================  ==============  ======================
the spawner's launch made ahead for the call's run     16.5, 30.0      fastest
a launch made ahead for any run (``ready_pool``)       26.3, 45.4      1.6x: the run's first
                                                                       calls, and any run
a launch made on the call's path (``made_now``)        58.5, 81.8      3x: none ready
launches by programs, bash or dash init                185-204         not root, or a kernel
                                                                       without pidfd exit
                                                                       status, or no bash
no control group: ``subprocess.Popen`` per call        224, 284        no control group here
=====================================================  ==============  ======================

- ``launch``: a launch, the call's groups with a process in them waiting for the call's line,
  made by programs (a shell joins the groups, then the guard, ``unshare`` and the init, in the
  shell text of ``shell_text``), or for a root worker by its spawner with system calls
  (``spawner_process``, one small process per worker process; the worker's side is
  ``spawner_client``). The processes a launch made are found through ``proc_lookup``.
- ``ready_pool``: the launches each worker process keeps ready, made between calls by one thread,
  for any run (``READY``) or for each of its recent runs alone (``EACH_RUN``: its folders bound,
  its init already the run's uid).
- Without a control group there is no launch: ``command`` starts the plan's command line with
  ``subprocess.Popen`` on the call's path, the private folders set up by a root shell step
  (``shell_text.PRIVATE_SCRIPT``), as a root worker's programs path does.
"""
