"""``traceml run / watch / serve``: process management for captured runs (DESIGN §1, §2.1, §3).

- :mod:`.runfolder`: creates the run folder, keeps ``run.json`` and ``aggregator/manifest.json``
  through the run's life (the in-script ``traceml_ai.Run`` takes run.json over; the launcher
  guarantees the final status).
- :mod:`.aggregator_process`: starts and stops the aggregator process of a run.
- :mod:`.launch`: starts the training (one process, ``torch.distributed.run`` for several, several
  nodes) under capture and returns its exit code.
"""
