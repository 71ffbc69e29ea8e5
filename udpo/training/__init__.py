"""The parts the training loop (:mod:`udpo.training.trainer`) calls, one job each, built in order by
:mod:`.parts` in the run's surroundings (:mod:`.run_env`: processes, precision, GPU share, lock, seeds,
trackers):

- :mod:`.data`: which questions a run trains, calibrates and evaluates on, and in what order;
- :mod:`.rollouts`: the debate engine (backend, protocol, agents), evaluation generators, adapter sync;
- :mod:`.calibration`: the warm-up calibration of UDPO's per-agent coefficients;
- :mod:`.update`: the optimizer, and one update (log-probs, the algorithm's losses, backward, step);
- :mod:`.replay`: the replay buffer, and how a run's update batch draws from it;
- :mod:`.evaluation`: the held-out evaluation, when it is due and what it writes;
- :mod:`.checkpointing`: saving and restoring everything a run needs to resume exactly.

The algorithms' math is in :mod:`udpo.algorithms`.
"""
