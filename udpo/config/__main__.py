"""``python -m udpo.config``: print the config reference tables that docs/training.md embeds."""

from udpo.config.recipes import reference_markdown

print(reference_markdown())
