package event

import (
	"context"
	"testing"
	"time"
)

// A tenure ends by End or by its local deadline; Done is closed then, an
// expired tenure cannot be extended back, and Enter refuses once it ended.
func TestTenureEndsAndCancels(t *testing.T) {
	ten := NewTenure("u", 1, time.Now().Add(time.Second))
	if !ten.Held() || !ten.Enter() {
		t.Fatal("a fresh tenure is held")
	}
	ten.Exit()
	ten.Extend(time.Now().Add(50 * time.Millisecond)) // the timer follows
	select {
	case <-ten.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the deadline")
	}
	ten.Extend(time.Now().Add(time.Hour))
	if ten.Held() || ten.Enter() {
		t.Fatal("an expired tenure was extended back to held")
	}

	ten = NewTenure("u", 2, time.Time{})
	ten.Extend(time.Now().Add(time.Hour))
	if !ten.Held() {
		t.Fatal("extended tenure not held")
	}
	ten.End()
	<-ten.Done()
	if ten.Held() {
		t.Fatal("ended tenure held")
	}
	var nilT *Tenure
	if !nilT.Held() || !nilT.Enter() || nilT.Done() != nil {
		t.Fatal("a nil tenure (single process) is always held and never done")
	}
}

// Quiesce waits for the requests Enter admitted before the end.
func TestTenureQuiesce(t *testing.T) {
	ten := NewTenure("u", 1, time.Time{})
	if !ten.Enter() {
		t.Fatal("enter")
	}
	ten.End()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ten.Quiesce(ctx); err == nil {
		t.Fatal("quiesce returned with a request in progress")
	}
	done := make(chan error, 1)
	go func() { done <- ten.Quiesce(context.Background()) }()
	ten.Exit()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("quiesce did not return after the last Exit")
	}
}

// Drain, a graceful end: the tenure stops being held at once (no new
// request enters), but the request in progress is not cancelled — Done
// stays open until it exits — and only then the tenure ends.
func TestTenureDrain(t *testing.T) {
	ten := NewTenure("orders#0/2", 1, time.Time{})
	if !ten.Enter() {
		t.Fatal("enter")
	}
	drained := make(chan error, 1)
	go func() { drained <- ten.Drain(context.Background()) }()
	deadline := time.Now().Add(10 * time.Second)
	for ten.Held() {
		if time.Now().After(deadline) {
			t.Fatal("still held while draining")
		}
		time.Sleep(time.Millisecond)
	}
	if ten.Enter() {
		t.Fatal("a new request entered a draining tenure")
	}
	select {
	case <-ten.Done():
		t.Fatal("Done closed (the request in progress cancelled) before it exited")
	case err := <-drained:
		t.Fatalf("Drain returned %v with a request in progress", err)
	case <-time.After(50 * time.Millisecond):
	}
	ten.Exit()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ten.Done():
	default:
		t.Fatal("tenure not ended after Drain")
	}
	if err := ten.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Bounded: a request that does not finish ends the tenure anyway
	// (its context is cancelled) and Drain says so.
	ten = NewTenure("orders#0/2", 2, time.Time{})
	ten.Enter()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ten.Drain(ctx); err == nil {
		t.Fatal("Drain with a request still in progress returned nil")
	}
	select {
	case <-ten.Done():
	default:
		t.Fatal("tenure not ended after a timed-out Drain")
	}
	ten.Exit()
}
