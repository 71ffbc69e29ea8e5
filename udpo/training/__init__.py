"""The parts the training loop (:mod:`udpo.training.trainer`) calls, one job each:

- :mod:`.data`: which questions a run trains, calibrates and evaluates on, and in what order;
- :mod:`.rollouts`: the debate engine (backend, protocol, agents), evaluation generators, adapter sync;
- :mod:`.calibration`: the warm-up calibration of UDPO's per-agent coefficients;
- :mod:`.update`: the optimizer, and one update (log-probs, the algorithm's losses, backward, step);
- :mod:`.checkpointing`: saving and restoring everything a run needs to resume exactly.

The algorithms' math is in :mod:`udpo.algorithms`.
"""
