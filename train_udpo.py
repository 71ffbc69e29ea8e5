"""Train a team of debating LLM agents with UDPO.

    python train_udpo.py --config recipes/quickstart.yaml
    accelerate launch train_udpo.py --config recipes/paper/gsm8k_n3_t3.yaml --learning_rate 2e-5
    torchrun --nproc_per_node 2 train_udpo.py --config recipes/quickstart.yaml
    accelerate launch --config_file recipes/accelerate/deepspeed_zero2.yaml train_udpo.py --config ...

Arguments are the fields of :class:`udpo.config.TrainConfig` (``--help`` lists them all).
"""

import sys

from udpo.config import parse_config
from udpo.env.backends.base import BackendError
from udpo.threads import configure_threads


def main() -> int:
    try:  # the config is checked before torch is imported: a mistake answers at once
        config = parse_config(require_config=True)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"train_udpo.py: error: {e}", file=sys.stderr)
        return 2
    configure_threads()
    from udpo.training.checkpoint_store import CheckpointError
    from udpo.training.run_lock import RunBusyError
    from udpo.training.trainer import TrainingError, train

    try:
        train(config)
    except (ValueError, FileNotFoundError, TrainingError, CheckpointError, BackendError, RunBusyError) as e:
        print(f"train_udpo.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
