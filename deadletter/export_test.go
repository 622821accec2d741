package deadletter

// SelfMachine is this process's machine key as a claim owner (claimOwner).
func SelfMachine() string { return self().Machine }

// ProcStart is procStart, for tests.
var ProcStart = procStart
