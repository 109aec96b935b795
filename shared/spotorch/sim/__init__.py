"""The trace simulator: replays Spot availability traces through the domain's escalation rules.

Not production code: the function bundle leaves it out (it needs numpy, a `sim` extra).
"""
