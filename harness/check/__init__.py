"""The judge: checkers (pure functions over every rank's records), the reference each step
is held to (the plain model, the spec's decision oracle of harness/spec, the harness's
plans for another system), `judge` that runs them once per scenario history, and the
exhaustive enumeration of small worlds' decisions. Nothing here starts a process or reaches
into a world."""
