//go:build unix

package app

import "syscall"

// openFileLimit returns the process's soft RLIMIT_NOFILE (the Go runtime
// raises it to the hard limit at start-up), 0 when unknown.
func openFileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}
