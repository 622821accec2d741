package confcheck

import (
	"errors"
	"testing"
)

func TestErrors(t *testing.T) {
	e := New("sqs", "")
	if e.Prefix() != "sqs" || e.Err() != nil {
		t.Fatalf("empty: prefix %q, err %v", e.Prefix(), e.Err())
	}
	e.Add(nil)
	if e.Err() != nil {
		t.Fatalf("Add(nil) added an error: %v", e.Err())
	}
	sentinel := errors.New("tls: bad")
	e = New("webhook", "hook")
	e.Addf("timeout must not be negative, got %d", -1)
	e.Add(sentinel)
	err := e.Err()
	want := "webhook hook: timeout must not be negative, got -1\ntls: bad"
	if err == nil || err.Error() != want {
		t.Fatalf("Err() = %v, want %q", err, want)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("Err() does not wrap the added error")
	}
}
