"""The exceptions libkvcr's failures raise: one class per KVCR_E* code
(include/kvcr/error.h), all under KVCRError, whose `code` is the C value.

Each class also derives from the builtin exception this package raised
before these classes existed (ValueError for an invalid argument,
NotImplementedError for what is not built, RuntimeError for the rest), so
`except ValueError:` written against older releases still catches what it
caught. Match on the class, not on the message text: the text names the
rule that was broken and may be reworded.

Rules checked in Python before libkvcr is called (the types of fields,
kvcr.config) raise the plain builtin, without a code."""
from __future__ import annotations


class KVCRError(Exception):
    """A failing libkvcr call; `code` is its negative KVCR_E* value."""

    code = 0


class KVCRInvalidArgument(KVCRError, ValueError):
    """KVCR_EINVAL: an argument or configuration value breaks a rule."""

    code = -1


class KVCROutOfMemory(KVCRError, MemoryError, RuntimeError):
    """KVCR_ENOMEM: out of memory; the call changed nothing."""

    code = -2


class KVCRClosedError(KVCRError, RuntimeError):
    """KVCR_ECLOSED: the instance was closed."""

    code = -3


class KVCRNotSupported(KVCRError, NotImplementedError):
    """KVCR_ENOTSUP: the feature is not built or not supported."""

    code = -4


class KVCRBusyError(KVCRError, RuntimeError):
    """KVCR_EBUSY: called re-entrantly from inside a callback."""

    code = -5


class KVCRNotFound(KVCRError, RuntimeError):
    """KVCR_ENOENT: the named object (an operation, a request) does not exist."""

    code = -6


class KVCRSystemError(KVCRError, RuntimeError):
    """KVCR_ESYS: a system call failed; the message carries errno's text."""

    code = -7


class KVCRServiceError(KVCRError, RuntimeError):
    """KVCR_EREFUSED: the KVCR service refused a request (its message says why)."""

    code = -9


class KVCRGuardProtocolError(KVCRServiceError):
    """KVCR_EPROTO: a malformed or incompatible message from the KVCR
    service or a peer."""

    code = -8


class KVCRMsgFramingError(KVCRServiceError):
    """A malformed length-prefixed frame on the service's socket."""

    code = -8


class KVCRLimitError(KVCRError, RuntimeError):
    """KVCR_ELIMIT: a configured limit (KVCRLimits) is reached; the message
    names it. Nothing was started: retry after polling."""

    code = -10


class KVCRSocketError(KVCRServiceError):
    """KVCR_EUNAVAIL: the KVCR service could not be reached (connect,
    connection or timeout)."""

    code = -11


# Indexed by -code: what kvcr._native raises for each libkvcr code.
BY_CODE = (None, KVCRInvalidArgument, KVCROutOfMemory, KVCRClosedError, KVCRNotSupported,
           KVCRBusyError, KVCRNotFound, KVCRSystemError, KVCRGuardProtocolError,
           KVCRServiceError, KVCRLimitError, KVCRSocketError)
