"""Pipeline jobs on Spark built on the ``headrace`` data source: load, snapshot, activity.

One module per job (``load``, ``snapshot``, ``activity``), a shared session builder
(``session``) and the fault hooks the crash tests drive (``faults``). No state here.
"""
