package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/event"
)

// orderLog records deliveries of several sinks in one sequence.
type orderLog struct {
	mu  sync.Mutex
	got []string
}

func (o *orderLog) add(s string) {
	o.mu.Lock()
	o.got = append(o.got, s)
	o.mu.Unlock()
}

func (o *orderLog) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.got...)
}

// loggingSink delivers into an orderLog, blocking each Send until gate is
// closed (nil: at once).
type loggingSink struct {
	name string
	log  *orderLog
	gate chan struct{}
}

func (s *loggingSink) Name() string  { return s.name }
func (s *loggingSink) MaxBatch() int { return 1 }
func (s *loggingSink) Close() error  { return nil }
func (s *loggingSink) Send(ctx context.Context, batch []*event.Event) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, e := range batch {
		s.log.add(e.ID)
	}
	return nil
}

// Two reloads that change a sink in quick succession: the third lane must
// not start before the first one has delivered what it holds, or a document's
// later event overtakes an earlier one.
func TestEngineReloadTwiceKeepsPerKeyOrder(t *testing.T) {
	log := &orderLog{}
	gate := make(chan struct{})
	a := &loggingSink{name: "s", log: log, gate: gate}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: a, Retry: fastRetry(3)})
	rules := eng.Rules()

	e1 := posEvent(t, 1, 7)
	acked := make(chan string, 4)
	eng.Dispatch(e1, func() { acked <- e1.ID })
	waitUntil(t, "first lane busy with e1", func() bool { return eng.Lane("s").Status().InProgress == 1 })

	b := &loggingSink{name: "s", log: log}
	if err := eng.Reload(rules, []LaneUpdate{{Name: "s", Spec: SinkSpec{Sink: b, Retry: fastRetry(3)}}}); err != nil {
		t.Fatal(err)
	}
	c := &loggingSink{name: "s", log: log}
	if err := eng.Reload(rules, []LaneUpdate{{Name: "s", Spec: SinkSpec{Sink: c, Retry: fastRetry(3)}}}); err != nil {
		t.Fatal(err)
	}
	e3 := posEvent(t, 3, 7)
	eng.Dispatch(e3, func() { acked <- e3.ID })

	// Give a wrongly started third lane the chance to deliver e3 first.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && len(log.list()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	close(gate)
	for range 2 {
		select {
		case <-acked:
		case <-time.After(10 * time.Second):
			t.Fatalf("not every event acked; delivered %v", log.list())
		}
	}
	if got := log.list(); len(got) != 2 || got[0] != e1.ID || got[1] != e3.ID {
		t.Fatalf("delivered %v, want [%s %s]", got, e1.ID, e3.ID)
	}
}

// A sink removed by one reload and added back by the next: the new lane must
// not deliver before the removed one has finished what it held.
func TestEngineReloadRemoveThenAddKeepsPerKeyOrder(t *testing.T) {
	log := &orderLog{}
	gate := make(chan struct{})
	a := &loggingSink{name: "s", log: log, gate: gate}
	eng := newTestEngine(t, newMemDL(), SinkSpec{Sink: a, Retry: fastRetry(3)})
	rules := eng.Rules()

	e1 := posEvent(t, 1, 7)
	acked := make(chan string, 4)
	eng.Dispatch(e1, func() { acked <- e1.ID })
	waitUntil(t, "first lane busy with e1", func() bool { return eng.Lane("s").Status().InProgress == 1 })

	none, err := CompileRules(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Reload(none, nil); err != nil {
		t.Fatal(err)
	}
	c := &loggingSink{name: "s", log: log}
	if err := eng.Reload(rules, []LaneUpdate{{Name: "s", Spec: SinkSpec{Sink: c, Retry: fastRetry(3)}}}); err != nil {
		t.Fatal(err)
	}
	e3 := posEvent(t, 3, 7)
	eng.Dispatch(e3, func() { acked <- e3.ID })

	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && len(log.list()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	close(gate)
	for range 2 {
		select {
		case <-acked:
		case <-time.After(10 * time.Second):
			t.Fatalf("not every event acked; delivered %v", log.list())
		}
	}
	if got := log.list(); len(got) != 2 || got[0] != e1.ID || got[1] != e3.ID {
		t.Fatalf("delivered %v, want [%s %s]", got, e1.ID, e3.ID)
	}
}
