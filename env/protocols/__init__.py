"""Debate protocols: who reads whom each round, in what form, and when agents stop (docs/protocols.md).

A :class:`Protocol` composes :class:`Stage` objects (hooks in ``base``): topologies (full, sparse,
random, DIG/DIGRA), the interventions of Estornell & Liu, controlled injection, stopping rules, and the
attacks' stages (message rewriting, profiles). ``build_protocol(ProtocolConfig(...), task, backend)``
builds one by name. See docs/protocols.md.
"""

from .base import DebateState, Message, Stage, peer_message
from .config import PROTOCOL_NAMES, ProtocolConfig, build_protocol
from .digra import DIGRATopology
from .injection import Injection
from .interventions import Interventions, Refuter
from .protocol import Protocol
from .rewrite import AssignProfiles, MessageRewrite, MessageTransform
from .stopping import StableAgentStop, UnanimityStop
from .topology import FullTopology, RandomTopology, SparseTopology, Topology

__all__ = [
    "PROTOCOL_NAMES",
    "AssignProfiles",
    "DIGRATopology",
    "DebateState",
    "FullTopology",
    "Injection",
    "Interventions",
    "Message",
    "MessageRewrite",
    "MessageTransform",
    "Protocol",
    "ProtocolConfig",
    "RandomTopology",
    "Refuter",
    "SparseTopology",
    "StableAgentStop",
    "Stage",
    "Topology",
    "UnanimityStop",
    "build_protocol",
    "peer_message",
]
