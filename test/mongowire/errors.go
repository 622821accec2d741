package mongowire

import (
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Server error codes used by mongowire (src/mongo/base/error_codes.yml).
const (
	codeInternalError          = 1
	codeBadValue               = 2
	codeFailedToParse          = 9
	codeTypeMismatch           = 14
	codeIllegalOperation       = 20
	codeNamespaceNotFound      = 26
	codeCursorNotFound         = 43
	codeNoMatchingDocument     = 47
	codeNamespaceExists        = 48
	codeCommandNotFound        = 59
	codeImmutableField         = 66
	codeCannotCreateIndex      = 67
	codeInvalidOptions         = 72
	codeInvalidNamespace       = 73
	codeIndexOptionsConflict   = 85
	codeIndexKeySpecsConflict  = 86
	codeIndexNotFound          = 27
	codeInvalidResumeToken     = 260
	codeCursorKilled           = 237
	codeChangeStreamFatalError = 280
	codeChangeStreamHistory    = 286
	codeUnsupportedOpQuery     = 352
	codeLocation40324          = 40324 // unrecognized pipeline stage
	codeDuplicateKey           = 11000

	codeWriteConflict              = 112
	codeConflictingOperation       = 117
	codeTransactionTooOld          = 225
	codeNoSuchTransaction          = 251
	codeTransactionCommitted       = 256
	codeOperationNotSupportedInTxn = 263
)

var codeNames = map[int32]string{
	codeInternalError:          "InternalError",
	codeBadValue:               "BadValue",
	codeFailedToParse:          "FailedToParse",
	codeTypeMismatch:           "TypeMismatch",
	codeIllegalOperation:       "IllegalOperation",
	codeNamespaceNotFound:      "NamespaceNotFound",
	codeIndexNotFound:          "IndexNotFound",
	codeCursorNotFound:         "CursorNotFound",
	codeNoMatchingDocument:     "NoMatchingDocument",
	codeNamespaceExists:        "NamespaceExists",
	codeCommandNotFound:        "CommandNotFound",
	codeImmutableField:         "ImmutableField",
	codeCannotCreateIndex:      "CannotCreateIndex",
	codeInvalidOptions:         "InvalidOptions",
	codeInvalidNamespace:       "InvalidNamespace",
	codeIndexOptionsConflict:   "IndexOptionsConflict",
	codeIndexKeySpecsConflict:  "IndexKeySpecsConflict",
	codeInvalidResumeToken:     "InvalidResumeToken",
	codeCursorKilled:           "CursorKilled",
	codeChangeStreamFatalError: "ChangeStreamFatalError",
	codeChangeStreamHistory:    "ChangeStreamHistoryLost",
	codeUnsupportedOpQuery:     "UnsupportedOpQueryCommand",
	codeDuplicateKey:           "DuplicateKey",

	codeWriteConflict:              "WriteConflict",
	codeConflictingOperation:       "ConflictingOperationInProgress",
	codeTransactionTooOld:          "TransactionTooOld",
	codeNoSuchTransaction:          "NoSuchTransaction",
	codeTransactionCommitted:       "TransactionCommitted",
	codeOperationNotSupportedInTxn: "OperationNotSupportedInTransaction",
	// Codes a fail point may inject, for realistic codeName values.
	6:     "HostUnreachable",
	7:     "HostNotFound",
	50:    "MaxTimeMSExpired",
	89:    "NetworkTimeout",
	91:    "ShutdownInProgress",
	189:   "PrimarySteppedDown",
	234:   "RetryChangeStream",
	262:   "ExceededTimeLimit",
	9001:  "SocketException",
	10107: "NotWritablePrimary",
	11600: "InterruptedAtShutdown",
	11602: "InterruptedDueToReplStateChange",
	13435: "NotPrimaryNoSecondaryOk",
	13436: "NotPrimaryOrSecondary",
	11601: "Interrupted",
	100:   "UnsatisfiableWriteConcern",
	79:    "UnknownReplWriteConcern",
	64:    "WriteConcernFailed",
	63:    "StaleShardVersion",
	133:   "FailedToSatisfyReadPreference",
	150:   "StaleEpoch",
	13388: "StaleConfig",
}

func codeName(code int32) string {
	if n, ok := codeNames[code]; ok {
		return n
	}
	return "Location" + strconv.Itoa(int(code))
}

// CommandError is a command failure as the server reports it:
// {ok: 0, errmsg, code, codeName, errorLabels}.
type CommandError struct {
	Code    int32
	Message string
	Labels  []string

	// info holds further fields of the error document (a BSON document
	// whose elements are appended), e.g. keyPattern and keyValue of a
	// duplicate key error.
	info bson.Raw
}

// appendInfo appends the elements of e.info to a document being built.
func (e *CommandError) appendInfo(dst []byte) []byte {
	if len(e.info) <= 5 {
		return dst
	}
	return append(dst, e.info[4:len(e.info)-1]...)
}

// Error implements error.
func (e *CommandError) Error() string {
	return fmt.Sprintf("(%s) %s", codeName(e.Code), e.Message)
}

func cmdErr(code int32, format string, args ...any) *CommandError {
	return &CommandError{Code: code, Message: fmt.Sprintf(format, args...)}
}
