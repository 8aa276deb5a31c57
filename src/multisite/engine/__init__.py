"""The embedded engine: an open instance, its transactions, recovery, commits and received applies.

Public API (re-exported by ``multisite``): ``create``, ``open``, ``Database``, ``Transaction``,
``TransactionBase``, ``RecoveryReport``, ``RollbackReport``, ``Durability``. Everything else in this
package is the engine's own; see ``DESIGN.md`` for its contract.
"""

from ..journal.durability import Durability
from .database import Database, create, open
from .recovery import RecoveryReport
from .rollback import RollbackReport
from .transaction import Transaction, TransactionBase

__all__ = ["Database", "Durability", "RecoveryReport", "RollbackReport", "Transaction", "TransactionBase",
           "create", "open"]
