"""udpo.env: tasks, data, trajectories, inference backends and debate protocols."""

from .backends import Backend, BackendError, ChatRequest, Completion, SamplingParams, make_backend
from .debate import AgentSpec, DebateConfig, DebateEnv
from .tasks import Question, Task, get_task
from .trajectory import Trajectory, TrajectoryWriter, Turn, read_trajectories

__all__ = [
    "AgentSpec",
    "Backend",
    "BackendError",
    "ChatRequest",
    "Completion",
    "DebateConfig",
    "DebateEnv",
    "Question",
    "SamplingParams",
    "Task",
    "Trajectory",
    "TrajectoryWriter",
    "Turn",
    "get_task",
    "make_backend",
    "read_trajectories",
]
