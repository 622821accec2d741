//go:build !unix

package app

// openFileLimit is unknown off unix.
func openFileLimit() int { return 0 }
