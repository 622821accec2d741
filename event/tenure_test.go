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
