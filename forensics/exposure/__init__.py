"""The exposure rule of log-schema.md section 5, in one place.

- ``reference``: the rule in plain Python, page by page: the executable statement of section 5
  that everything else is held to.
- ``kernel`` and ``sweep``: the same rule compiled over page ranges, and the sweep that feeds it
  from a case and names its rows; ``analysis`` runs it and ``sql/analysis.sql`` names the tables.
- ``figures``: the eight summary figures, what each counts, and the queries that re-check them.
- ``tiers``: on what evidence each exposure rests, and the replay-backed tiers.

Nothing here is imported by ``forensics`` itself: numba loads only when a case is analysed.
"""
