"""Where a comparison's runs run: a Ray cluster (:mod:`.cluster`: one started here or one at an address, checked
before any work), each run's share of it (:mod:`.resources`), the grid of runs as the scheduler sees them
(:mod:`.grid`), Ray Tune's launch of the grid (:mod:`.tune`, with early stopping within an arm, :mod:`.schedulers`,
and its one progress line, :mod:`.progress`), and a run of several workers under Ray Train (:mod:`.train_worker`).
Nothing here knows what a run does: the grid carries that as a callable."""
