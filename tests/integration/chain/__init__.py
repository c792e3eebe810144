"""One chain of real node processes: delivery, errors and hostile input, faults and restarts,
liveness, peer authentication, transactions read back."""
