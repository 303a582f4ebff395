"""What keeps a run's ranks in step when something fails: stop signals and a dead launcher
(a checkpoint at an agreed step), a hung step, a non-finite loss, and the fault injection
that tests all of them. The loop reaches them through ``guards`` alone.
"""
