"""The experiments: commands that run many runs and compare them (``compare``, ``tune``).

They sit above the API (each run is a :func:`fedrift.run`) and below the command line; they
share a pool of run workers (:mod:`.pool`), folder names (:mod:`.naming`), search spaces
(:mod:`.space`) and a tune's choices (:mod:`.tuned`). The report (:mod:`fedrift.report`)
sits below them: it reads run folders and takes plain data, and never imports this layer.
The package exports nothing itself: ``fedrift.compare``, ``fedrift.tune`` and
``fedrift.write_report`` are the public names, and its modules keep their own names
(``fedrift.experiments.compare`` is the module, not the function).
"""
