package router

import (
	"sort"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when a test advances it. Timers fire
// (in deadline order) when Advance reaches them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{}
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC), timers: map[*fakeTimer]struct{}{}}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) (<-chan time.Time, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		return t.c, func() {}
	}
	f.timers[t] = struct{}{}
	return t.c, func() {
		f.mu.Lock()
		delete(f.timers, t)
		f.mu.Unlock()
	}
}

// Advance moves the clock by d and fires the timers due.
func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	var due []*fakeTimer
	for t := range f.timers {
		if !t.at.After(f.now) {
			due = append(due, t)
		}
	}
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		delete(f.timers, t)
		t.c <- f.now
	}
}

// hasTimer reports whether a timer with deadline at is pending.
func (f *fakeClock) hasTimer(at time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for tm := range f.timers {
		if tm.at.Equal(at) {
			return true
		}
	}
	return false
}

// waitTimer waits (in real time, bounded) until a timer with deadline at is
// pending: a goroutine is blocked waiting for that moment.
func (f *fakeClock) waitTimer(t *testing.T, what string, at time.Time) {
	t.Helper()
	waitUntil(t, what, func() bool { return f.hasTimer(at) })
}
