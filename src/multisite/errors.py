"""One exception tree for the whole system.

Every error carries a stable ``code`` (used by the CLI's exit output, by the wire protocol's
error message and by scripts) and a message that says what went wrong, where, and what to do.
The CLI prints ``str(err)`` without a traceback.
"""

from __future__ import annotations


class MultisiteError(Exception):
    """Root of every error multisite raises on purpose."""

    code = "MULTISITE"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ConfigError(MultisiteError, ValueError):
    """A setting, argument or configuration file is wrong."""

    code = "CONFIG"


class KeyTypeError(MultisiteError, TypeError):
    """A key is not a tuple of str and int."""

    code = "KEY_TYPE"


class ValueEncodeError(MultisiteError, TypeError):
    """A value cannot be encoded as a msgpack document."""

    code = "VALUE_ENCODE"


class RegionNotFound(MultisiteError, KeyError):
    code = "REGION_NOT_FOUND"

    def __str__(self) -> str:  # KeyError would quote the message
        return f"{self.code}: {self.message}"


class TransactionError(MultisiteError):
    """Misuse of transactions: nesting, use after commit, updates on a closed handle."""

    code = "TRANSACTION"


class NotAnInstance(MultisiteError):
    code = "NOT_AN_INSTANCE"


class UnsafePermissions(ConfigError):
    """A directory multisite keeps data in (an instance, a document database, a server's home) can be
    written by every user of the host: refused, naming the directory and the ``chmod`` that fixes it."""

    code = "UNSAFE_PERMISSIONS"


class InstanceExists(MultisiteError):
    code = "INSTANCE_EXISTS"


class InstanceLocked(MultisiteError):
    """Another process owns the instance."""

    code = "INSTANCE_LOCKED"


class InstanceFileCorrupt(MultisiteError):
    code = "INSTANCE_FILE_CORRUPT"


class StoreCorrupt(MultisiteError):
    """The store (SQLite) file cannot be read: damaged, or not a database."""

    code = "STORE_CORRUPT"


class StoreLost(MultisiteError):
    """SQLite rolled back the store's open transaction by itself (a full disk, an I/O error): the
    changes since the last flush are gone from the store. They are in the journal, which recovery
    rolls the store forward from: the instance must be reopened."""

    code = "STORE_LOST"


class JournalError(MultisiteError):
    code = "JOURNAL"


class JournalCorrupt(JournalError):
    """A journal segment holds bytes that are not a valid record where one must be."""

    code = "JOURNAL_CORRUPT"

    def __init__(self, message: str, *, path: str = "", offset: int = -1, **details: object) -> None:
        super().__init__(message, path=path, offset=offset, **details)
        self.path = path
        self.offset = offset


class JournalGap(JournalError):
    """Records needed are no longer in the journal (pruned) or a seqno is missing."""

    code = "JOURNAL_GAP"


class StorageFull(MultisiteError, OSError):
    """The disk is full; nothing acknowledged was lost, the failed commit was not applied."""

    code = "STORAGE_FULL"


class NotPrimary(MultisiteError):
    """Application updates were attempted on an instance that is a replicating secondary."""

    code = "NOT_PRIMARY"


class HistoryMismatch(MultisiteError):
    """Two instances' histories do not allow replication without a rollback (or at all)."""

    code = "HISTORY_MISMATCH"


class GroupMismatch(HistoryMismatch):
    code = "GROUP_MISMATCH"


class NoFreeStream(HistoryMismatch):
    """A supplementary instance already receives 15 SI streams, each tied to its group: a 16th group
    gets none."""

    code = "NO_FREE_STREAM"


class RollbackError(MultisiteError):
    code = "ROLLBACK"


class LostFileCorrupt(MultisiteError):
    code = "LOST_FILE_CORRUPT"


class ProtocolError(MultisiteError):
    code = "PROTOCOL"


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow in the current state."""

    code = "LOCAL_PROTOCOL"


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes or a message the protocol does not allow; the connection must close."""

    code = "REMOTE_PROTOCOL"


class FilterError(MultisiteError):
    """A replication filter failed (crashed, timed out, answered out of step or with a malformed
    transaction): the link stops, and nothing of the batch it was filtering is sent or applied."""

    code = "FILTER"


class ConnectionLost(MultisiteError):
    code = "CONNECTION_LOST"


class MinConfirmTimeout(MultisiteError):
    """A commit is hard on the primary but fewer than ``--min-confirm`` secondaries confirmed it in time:
    it may be lost if the primary fails over now."""

    code = "MIN_CONFIRM_TIMEOUT"


class CoordinatorUnavailable(MultisiteError):
    """No member of the etcd cluster answered (or none with a majority): HA decisions wait for it."""

    code = "COORDINATOR_UNAVAILABLE"


class CoordinatorError(MultisiteError):
    """An etcd member answered a request with an error (not a lost connection: retrying elsewhere would not help)."""

    code = "COORDINATOR"


class ServerError(MultisiteError):
    """A server process could not be started, stopped or reached."""

    code = "SERVER"


class GridPolicyError(ConfigError):
    """A grid's deployment policy (``grid.toml``) is wrong: the message names the file and the key."""

    code = "GRID_POLICY"

    def __init__(self, message: str, *, path: str = "", key: str = "", **details: object) -> None:
        super().__init__(message, path=path, key=key, **details)
        self.path = path
        self.key = key


class WrongGrid(MultisiteError):
    """A container and a catalog belong to different grids: the catalog refused the container's
    registration (the message names both grids)."""

    code = "WRONG_GRID"


class WrongPartition(MultisiteError):
    """A key or a request belongs to another partition of the grid than the one it was sent to (a grid
    transaction updates the keys of one partition only)."""

    code = "WRONG_PARTITION"


class ReplicationVotedToRollback(MultisiteError):
    """Too few synchronous replicas voted to commit a transaction on a grid primary: it was committed
    nowhere. The counts say why (``commit_votes`` of ``min_sync`` needed, from ``voters`` asked)."""

    code = "REPLICATION_VOTED_TO_ROLLBACK"

    def __init__(self, message: str, *, commit_votes: int = 0, min_sync: int = 0, voters: int = 0,
                 rollback_votes: int = 0, timed_out: int = 0, **details: object) -> None:
        super().__init__(message, commit_votes=commit_votes, min_sync=min_sync, voters=voters,
                         rollback_votes=rollback_votes, timed_out=timed_out, **details)

    # Read from ``details``: a client re-raising a server's error builds it with the message only.
    @property
    def commit_votes(self) -> int:
        return int(self.details.get("commit_votes", 0))

    @property
    def min_sync(self) -> int:
        return int(self.details.get("min_sync", 0))

    @property
    def voters(self) -> int:
        return int(self.details.get("voters", 0))

    @property
    def rollback_votes(self) -> int:
        return int(self.details.get("rollback_votes", 0))

    @property
    def timed_out(self) -> int:
        return int(self.details.get("timed_out", 0))


class CommitOutcomeUnknown(MultisiteError):
    """A commit was sent but its answer never came (a grid primary's container died, an instance's
    primary failed over, the connection broke): it may have committed or not. The client does not
    retry it (that could apply it twice); the application checks and decides."""

    code = "COMMIT_OUTCOME_UNKNOWN"


class GridUnavailable(MultisiteError):
    """A grid partition has no primary that can take the request now (its container is down and no
    replica can be promoted without losing commits, or it is cut off from the catalog), and it did
    not come back within the client's timeout."""

    code = "GRID_UNAVAILABLE"


class PipelineError(MultisiteError):
    code = "PIPELINE"


# -- journal archive (issue 18) ------------------------------------------------------------------------
class ArchiveError(MultisiteError):
    """A journal archive cannot be written or read as asked (unreachable, another instance's, gapped)."""

    code = "ARCHIVE"


class ArchiveCorrupt(ArchiveError):
    """An archived file does not match the CRC recorded when it was archived (or is missing)."""

    code = "ARCHIVE_CORRUPT"


# -- multi-master documents (issue 12) ---------------------------------------------------------------
class DocumentError(MultisiteError):
    """A document database or a document in it is used wrongly or holds something it must not."""

    code = "DOCUMENT"


class DocumentNotFound(DocumentError, KeyError):
    code = "DOCUMENT_NOT_FOUND"

    def __str__(self) -> str:  # KeyError would quote the message
        return f"{self.code}: {self.message}"


class DocumentDeleted(DocumentError):
    """The document was deleted (only its deletion stub remains): it cannot be updated."""

    code = "DOCUMENT_DELETED"


class MalformedDocument(DocumentError):
    """A document (stored or received) is not of the document shape: the message names the field."""

    code = "DOCUMENT_MALFORMED"


class RevisionsCorrupt(MalformedDocument):
    """A document's ``$Revisions`` history does not match its OID (wrong length, times out of order)."""

    code = "REVISIONS_CORRUPT"


class NotADocumentDatabase(DocumentError):
    """A directory is an instance but not a document database (or not an instance at all)."""

    code = "NOT_A_DOCUMENT_DATABASE"


class ReplicaMismatch(DocumentError):
    """Two databases were asked to replicate but their replica IDs differ (they are not replicas)."""

    code = "REPLICA_MISMATCH"


class ReplicationRefused(DocumentError):
    """A replication session ran, but a direction it was asked for was refused for some database (an
    ACL, a replica the peer does not hold): the report names each. The CLI exits with ``exit_code``
    (not 1: a script can tell "ran, partly refused" from "did not run")."""

    code = "REPLICATION_REFUSED"
    exit_code = 3


class AccessDenied(DocumentError):
    """A database's ACL refuses a server: it may not see the database, or (a reader) may not push to it."""

    code = "ACCESS_DENIED"


# -- guaranteed message delivery (delivery/) ------------------------------------------------------
class DeliveryError(MultisiteError):
    """Guaranteed message delivery could not do what was asked (see ``delivery/DESIGN.md``)."""

    code = "DELIVERY"


class DeliveryConfigError(ConfigError):
    """A publication, subscription or remote setup is wrong or missing."""

    code = "DELIVERY_CONFIG"


class MessageCorrupt(DeliveryError):
    """A message file is damaged or truncated: it is not applied and stays aside for inspection."""

    code = "MESSAGE_CORRUPT"


class MessageAuthFailed(DeliveryError):
    """A message failed authentication (wrong key, or changed on the way): refused, not applied."""

    code = "MESSAGE_AUTH"


class OffsetMismatch(DeliveryError):
    """A confirmation or resend request names an offset the sender never sent (state lost or foreign)."""

    code = "DELIVERY_OFFSET"


# -- client authentication (issue 14) ------------------------------------------------------------
class AuthenticationFailed(MultisiteError):
    """An instance server refused a client's credentials (a wrong user or password, a user that needs
    a client certificate): the server closed the connection and logged the client's address."""

    code = "AUTHENTICATION_FAILED"


class AuthenticationRequired(AuthenticationFailed):
    """The instance server requires clients to authenticate and this one has not (yet): connect with
    ``user=`` and ``password=``, or with a client certificate naming a user."""

    code = "AUTHENTICATION_REQUIRED"


class AuthenticationPaced(AuthenticationFailed):
    """Too many failed authentications came from this client's address: the server refuses further
    attempts from it, without looking at them, until the delay it names has passed."""

    code = "AUTHENTICATION_PACED"


class PermissionDenied(MultisiteError):
    """The authenticated user's role does not allow the operation (a read-only user committing, say)."""

    code = "PERMISSION_DENIED"


class TooManyConnections(MultisiteError):
    """An instance server refused a connection at accept: it holds as many client connections, or as
    many not yet logged in (from this address, or in all), as it takes at once. Retry later."""

    code = "TOO_MANY_CONNECTIONS"


class ArchiveUnreachable(ArchiveError):
    """A journal archive's storage did not answer (network, a 5xx, throttling): ``--follow`` retries."""

    code = "ARCHIVE_UNREACHABLE"
