"""Kafka error codes as exceptions, shared by every layer.

Owns: the mapping between Kafka's numeric wire error codes and Python exceptions.
Code anywhere raises a ``KafkaError`` subclass with a one-line message; the one place
that encodes a response (a broker handler) turns it into ``error.code``.
Pure data; thread-safe.
"""

from __future__ import annotations


class KafkaError(Exception):
    """Base for errors that carry a Kafka wire error code."""

    code: int = -1
    retriable: bool = False
    # KIP-467: (batch_index, message) of each refused record, for Produce v8+ responses.
    record_errors: tuple[tuple[int, str], ...] = ()

    def __init__(self, message: str = "") -> None:
        super().__init__(message or type(self).__name__)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__


ERRORS_BY_CODE: dict[int, type[KafkaError]] = {}


def _define(name: str, code: int, retriable: bool = False) -> type[KafkaError]:
    cls = type(name, (KafkaError,), {"code": code, "retriable": retriable})
    ERRORS_BY_CODE[code] = cls
    return cls


UnknownServerError = _define("UnknownServerError", -1)
OffsetOutOfRange = _define("OffsetOutOfRange", 1)
CorruptMessage = _define("CorruptMessage", 2, True)
UnknownTopicOrPartition = _define("UnknownTopicOrPartition", 3, True)
InvalidFetchSize = _define("InvalidFetchSize", 4)
LeaderNotAvailable = _define("LeaderNotAvailable", 5, True)
NotLeaderOrFollower = _define("NotLeaderOrFollower", 6, True)
RequestTimedOut = _define("RequestTimedOut", 7, True)
MessageTooLarge = _define("MessageTooLarge", 10)
OffsetMetadataTooLarge = _define("OffsetMetadataTooLarge", 12)
NetworkException = _define("NetworkException", 13, True)
CoordinatorLoadInProgress = _define("CoordinatorLoadInProgress", 14, True)
CoordinatorNotAvailable = _define("CoordinatorNotAvailable", 15, True)
NotCoordinator = _define("NotCoordinator", 16, True)
InvalidTopic = _define("InvalidTopic", 17)
RecordListTooLarge = _define("RecordListTooLarge", 18)
NotEnoughReplicas = _define("NotEnoughReplicas", 19, True)
NotEnoughReplicasAfterAppend = _define("NotEnoughReplicasAfterAppend", 20, True)
InvalidRequiredAcks = _define("InvalidRequiredAcks", 21)
IllegalGeneration = _define("IllegalGeneration", 22)
InconsistentGroupProtocol = _define("InconsistentGroupProtocol", 23)
InvalidGroupId = _define("InvalidGroupId", 24)
UnknownMemberId = _define("UnknownMemberId", 25)
InvalidSessionTimeout = _define("InvalidSessionTimeout", 26)
RebalanceInProgress = _define("RebalanceInProgress", 27)
InvalidCommitOffsetSize = _define("InvalidCommitOffsetSize", 28)
TopicAuthorizationFailed = _define("TopicAuthorizationFailed", 29)
GroupAuthorizationFailed = _define("GroupAuthorizationFailed", 30)
ClusterAuthorizationFailed = _define("ClusterAuthorizationFailed", 31)
InvalidTimestamp = _define("InvalidTimestamp", 32)
UnsupportedSaslMechanism = _define("UnsupportedSaslMechanism", 33)
IllegalSaslState = _define("IllegalSaslState", 34)
UnsupportedVersion = _define("UnsupportedVersion", 35)
TopicAlreadyExists = _define("TopicAlreadyExists", 36)
InvalidPartitions = _define("InvalidPartitions", 37)
InvalidReplicationFactor = _define("InvalidReplicationFactor", 38)
InvalidReplicaAssignment = _define("InvalidReplicaAssignment", 39)
InvalidConfig = _define("InvalidConfig", 40)
NotController = _define("NotController", 41, True)
InvalidRequest = _define("InvalidRequest", 42)
UnsupportedForMessageFormat = _define("UnsupportedForMessageFormat", 43)
PolicyViolation = _define("PolicyViolation", 44)
OutOfOrderSequenceNumber = _define("OutOfOrderSequenceNumber", 45)
DuplicateSequenceNumber = _define("DuplicateSequenceNumber", 46)
InvalidProducerEpoch = _define("InvalidProducerEpoch", 47)
InvalidTxnState = _define("InvalidTxnState", 48)
InvalidProducerIdMapping = _define("InvalidProducerIdMapping", 49)
InvalidTransactionTimeout = _define("InvalidTransactionTimeout", 50)
ConcurrentTransactions = _define("ConcurrentTransactions", 51, True)
TransactionCoordinatorFenced = _define("TransactionCoordinatorFenced", 52)
TransactionalIdAuthorizationFailed = _define("TransactionalIdAuthorizationFailed", 53)
SecurityDisabled = _define("SecurityDisabled", 54)
OperationNotAttempted = _define("OperationNotAttempted", 55)
KafkaStorageError = _define("KafkaStorageError", 56, True)
LogDirNotFound = _define("LogDirNotFound", 57)
UnknownProducerId = _define("UnknownProducerId", 59)
NonEmptyGroup = _define("NonEmptyGroup", 68)
GroupIdNotFound = _define("GroupIdNotFound", 69)
FetchSessionIdNotFound = _define("FetchSessionIdNotFound", 70, True)
InvalidFetchSessionEpoch = _define("InvalidFetchSessionEpoch", 71, True)
TopicDeletionDisabled = _define("TopicDeletionDisabled", 73)
FencedLeaderEpoch = _define("FencedLeaderEpoch", 74, True)
UnknownLeaderEpoch = _define("UnknownLeaderEpoch", 75, True)
UnsupportedCompressionType = _define("UnsupportedCompressionType", 76)
OffsetNotAvailable = _define("OffsetNotAvailable", 78, True)
MemberIdRequired = _define("MemberIdRequired", 79)
PreferredLeaderNotAvailable = _define("PreferredLeaderNotAvailable", 80, True)
GroupMaxSizeReached = _define("GroupMaxSizeReached", 81)
FencedInstanceId = _define("FencedInstanceId", 82)
EligibleLeadersNotAvailable = _define("EligibleLeadersNotAvailable", 83, True)
ElectionNotNeeded = _define("ElectionNotNeeded", 84)
NoReassignmentInProgress = _define("NoReassignmentInProgress", 85)
GroupSubscribedToTopic = _define("GroupSubscribedToTopic", 86)
InvalidRecord = _define("InvalidRecord", 87)
UnstableOffsetCommit = _define("UnstableOffsetCommit", 88, True)
ProducerFenced = _define("ProducerFenced", 90)
UnknownTopicId = _define("UnknownTopicId", 100, True)
InconsistentTopicId = _define("InconsistentTopicId", 103, True)
TransactionalIdNotFound = _define("TransactionalIdNotFound", 105)
TransactionAbortable = _define("TransactionAbortable", 120)


def error_for_code(code: int, message: str = "") -> KafkaError:
    """An exception instance for a wire error code (UnknownServerError if unknown)."""
    return ERRORS_BY_CODE.get(code, UnknownServerError)(message)
