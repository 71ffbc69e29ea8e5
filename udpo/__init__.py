"""UDPO: train teams of LLM agents to debate well with Uncertainty-Driven Policy Optimization."""

__version__ = "0.1.0"
