"""The guard in the training loop, in two rooms: what it watches of a run and the rules that judge it (``watch``),
and the replay that says whose doing a finding is, the configuration's or the training's (``replay``)."""
