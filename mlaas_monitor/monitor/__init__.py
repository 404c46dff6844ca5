"""The extraction monitor: per user and per colluding group, how much of a served
decision tree has been extracted, measured from the query and response streams alone.

Pure core (no I/O): ``infogain`` (IG status and fidelity), ``coverage`` (per-leaf query
boxes and the covered fraction of the feature space), ``schedule`` (when a subject is
evaluated), ``pool`` (rows pooled by what they look like), ``core`` (per-model state,
warnings, enforcement decisions). Thin layers over it: ``persist`` (SQLite tables in the
gateway's store), ``service`` (query-stream listener, admin API, metrics, enforcement),
``attacks`` (real HTTP attackers) and ``evaluate`` (``analysim monitor-eval``: the run,
with its curves in ``curves`` and its report in ``eval_report``).
"""
