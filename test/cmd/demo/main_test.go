package main

import "testing"

// The README's one-command demo must keep working: it fails unless the
// receiver gets the two matching events with valid signatures.
func TestDemo(t *testing.T) {
	if err := run(false); err != nil {
		t.Fatal(err)
	}
}
