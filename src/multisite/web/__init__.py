"""The web dashboard (``multisite dashboard``): the topology map, lag and backlog over time, commit
rates, history records, lost-transaction files and the schedule map, for operators.

``model`` is sans-IO (what the page shows, from statuses); ``app`` polls the targets and serves the
page and its ``/api`` with aiohttp; ``static/`` holds the page and the vendored uPlot chart library
(uPlot 1.6.32 from the npm registry, MIT, its LICENSE beside it: no CDN, machines may be offline).
"""
