"""The error tree's old, private home: kept so that `tooljail._errors` imports work.

The tree lives in `tooljail.errors`; import it from there (or from `tooljail`).
This module re-exports exactly its names, so the two cannot drift apart.
"""

from tooljail import errors as _tree
from tooljail.errors import *  # noqa: F403

__all__ = list(_tree.__all__)
