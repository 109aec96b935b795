"""The trace simulator: replays Spot availability traces through the domain's escalation rules.

Not production code: the function bundle leaves it out (it needs numpy, a `sim` extra).
Modules: `model` (traces, scenario, windows, the views' settings), `replay` (one online policy
on one window, in the visible or the production view), `optimal` (the offline optimum and the
brute force that checks it), `evaluate` (many windows, aggregates), `simulate` (the
`spotorch simulate` command line, re-exporting the rest).
"""
