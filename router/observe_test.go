package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
	"github.com/changegate/changegate/sinks"
)

// recorder is an Observer that writes down every edge, one line each, per
// event id.
type recorder struct {
	name  string
	mu    sync.Mutex
	edges map[string][]string
	last  map[string]observe.Outcome
}

type ctxMark struct{ name string }

func newRecorder(name string) *recorder {
	return &recorder{name: name, edges: map[string][]string{}, last: map[string]observe.Outcome{}}
}

func (r *recorder) add(id, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.edges[id] = append(r.edges[id], line)
}

func (r *recorder) of(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.edges[id])
}

func (r *recorder) Dispatched(d observe.Dispatch) {
	var sinks []string
	for _, s := range d.Targets {
		sinks = append(sinks, d.Sinks[s].Name+"/"+d.Sinks[s].Kind)
	}
	r.add(d.Event.ID, fmt.Sprintf("dispatched rules=%v sinks=%v", d.Rules, sinks))
}

func (r *recorder) AttemptStart(ctx context.Context, a observe.Attempt) context.Context {
	for _, ev := range a.Events {
		r.add(ev.ID, fmt.Sprintf("start %s #%d %s", a.Sink.Name, a.Number, a.Redelivery))
	}
	return context.WithValue(ctx, ctxMark{r.name}, true)
}

func (r *recorder) AttemptEnd(ctx context.Context, a observe.Attempt) {
	marked, _ := ctx.Value(ctxMark{r.name}).(bool)
	f := a.Failure
	for _, ev := range a.Events {
		r.add(ev.ID, fmt.Sprintf("end %s #%d marked=%v err=%v reason=%s status=%d code=%s answer=%q sent=%v",
			a.Sink.Name, a.Number, marked, a.Err != nil, f.Reason, f.Status, f.Code, f.Answer, a.Duration > 0 || a.Err == nil))
	}
}

func (r *recorder) Outcome(o observe.Outcome) {
	line := fmt.Sprintf("%s %s attempts=%d", o.Kind, o.Sink.Name, o.Attempts)
	if o.Reason != "" {
		line += " reason=" + o.Reason
	}
	if o.Kind == observe.Retrying {
		line += fmt.Sprintf(" failure=%s wait>0=%v", o.Failure.Reason, o.Wait > 0)
	}
	if o.Store.Op != "" {
		line += fmt.Sprintf(" store=%s failed=%v", o.Store.Op, o.Store.Failed)
	}
	r.add(o.Event.ID, line)
	r.mu.Lock()
	r.last[o.Event.ID] = o
	r.mu.Unlock()
}

// dispatchWait dispatches ev and waits for its ack.
func dispatchWait(t *testing.T, e *Engine, ev *event.Event) {
	t.Helper()
	acked := make(chan struct{})
	e.Dispatch(ev, func() { close(acked) })
	select {
	case <-acked:
	case <-time.After(10 * time.Second):
		t.Fatalf("event %s never acknowledged", ev.ID)
	}
}

// The router calls its observers at the edges only: once when a change is
// dispatched (with its rules and sinks), around each attempt (the context
// of AttemptStart is the request's, and reaches AttemptEnd), and at each
// outcome: a retry, a dead letter with its store write, a delivery, a
// change routed nowhere. Two observers (Fanout) see the same, each its own
// context value.
func TestObserverEdges(t *testing.T) {
	a, b := newRecorder("a"), newRecorder("b")
	var seen sync.Map // event id → the request's context carried both marks
	sink := &fakeSink{name: "hook"}
	sink.setFail(func(ev *event.Event) error {
		if seqOf(ev) != 1 {
			return nil
		}
		n, _ := seen.LoadOrStore("calls", new(int))
		*n.(*int)++
		if *n.(*int) == 1 {
			err := sinks.Retryable("http_503", 0, errors.New("HTTP 503"))
			err.Status, err.Answer = 503, "busy"
			return err
		}
		err := sinks.Permanent("http_400", errors.New("HTTP 400"))
		err.Status, err.Answer = 400, "bad"
		return err
	})
	e := startEngine(t, newMemDL(), observe.Fanout(a, nil, b), SinkSpec{Sink: sink, Kind: "webhook", Retry: fastRetry(5)})
	bad, good, unrouted := posEvent(t, 1, 1), posEvent(t, 2, 2), posEvent(t, 3, 3)
	unrouted.Source = "inventory"
	for _, ev := range []*event.Event{bad, good, unrouted} {
		dispatchWait(t, e, ev)
	}
	want := map[string][]string{
		bad.ID: {
			"dispatched rules=[all] sinks=[hook/webhook]",
			"start hook #1 ",
			`end hook #1 marked=true err=true reason=http_503 status=503 code= answer="busy" sent=true`,
			"retrying hook attempts=1 failure=http_503 wait>0=true",
			"start hook #2 ",
			`end hook #2 marked=true err=true reason=http_400 status=400 code= answer="bad" sent=true`,
			"dead_lettered hook attempts=2 reason=http_400 store=dead_letter failed=false",
		},
		good.ID: {
			"dispatched rules=[all] sinks=[hook/webhook]",
			"start hook #1 ",
			`end hook #1 marked=true err=false reason= status=0 code= answer="" sent=true`,
			"delivered hook attempts=1",
		},
		unrouted.ID: {"dispatched rules=[] sinks=[]"},
	}
	for _, r := range []*recorder{a, b} {
		for id, lines := range want {
			if got := r.of(id); !slices.Equal(got, lines) {
				t.Errorf("observer %s, event %s:\n got %q\nwant %q", r.name, id, got, lines)
			}
		}
	}
	if got := a.last[good.ID].Event; got == nil || got.ID != good.ID || string(got.DocumentKey) != string(good.DocumentKey) {
		t.Errorf("outcome's event %+v, want the delivered one", got)
	}
}

// A change a sink's shape skips (skip_empty_updates) has a Skipped
// outcome for it and is delivered to the others.
func TestObserverSkipped(t *testing.T) {
	status, all := &fakeSink{name: "status"}, &fakeSink{name: "all"}
	onlyStatus := shapeOf(t, event.ShapeSpec{Fields: []event.Field{{Path: "fullDocument.status", Include: true}}, SkipEmptyUpdates: true})
	rs, err := CompileRulesShaped([]RuleSpec{{Name: "r", Source: "users", Sinks: []string{"status", "all"}}}, []string{"status", "all"}, []*event.Shape{onlyStatus, nil})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(rs, []SinkSpec{{Sink: status, Retry: fastRetry(1)}, {Sink: all, Retry: fastRetry(1)}}, newMemDL(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder("r")
	e.SetObserver(rec)
	ctx, cancel := context.WithCancel(context.Background())
	e.Start(ctx)
	defer func() { cancel(); e.Stop() }()
	ev := userEvent(t, 1, "a@b.c", bson.D{{Key: "note", Value: 1}})
	dispatchWait(t, e, ev)
	want := []string{
		"dispatched rules=[r] sinks=[status/ all/]",
		"skipped status attempts=0 reason=skipped_empty",
		"start all #1 ",
		`end all #1 marked=true err=false reason= status=0 code= answer="" sent=true`,
		"delivered all attempts=1",
	}
	if got := rec.of(ev.ID); !slices.Equal(got, want) {
		t.Errorf("edges:\n got %q\nwant %q", got, want)
	}
}

// nopObserver is an Observer that does nothing.
type nopObserver struct{}

func (nopObserver) Dispatched(observe.Dispatch) {}
func (nopObserver) AttemptStart(ctx context.Context, _ observe.Attempt) context.Context {
	return ctx
}
func (nopObserver) AttemptEnd(context.Context, observe.Attempt) {}
func (nopObserver) Outcome(observe.Outcome)                     {}

// Without an observer the edges cost nothing: the dispatch hooks allocate
// nothing, and the edges themselves allocate nothing either (an observer
// that does nothing adds no allocation to an event's way through the
// engine, dispatch to acknowledgement).
func TestNoObserverAllocatesNothing(t *testing.T) {
	perEvent := func(obs observe.Observer) float64 {
		e := startEngine(t, newMemDL(), obs, SinkSpec{Sink: nopSink{"hook", 1}, Kind: "webhook", MaxInFlight: 1, BatchSize: 1})
		evs := make([]*event.Event, 0, 300)
		for i := range 300 {
			evs = append(evs, posEvent(t, i, i))
		}
		var wg sync.WaitGroup
		ack := func() { wg.Done() }
		i := 0
		return testing.AllocsPerRun(200, func() {
			ev := evs[i]
			i++
			wg.Add(1)
			e.BeginDispatch(ev)
			e.Dispatch(ev, ack)
			e.EndDispatch(ev)
			wg.Wait()
		})
	}
	e := startEngine(t, newMemDL(), nil, SinkSpec{Sink: nopSink{"hook", 1}})
	ev := posEvent(t, 1, 1)
	if n := testing.AllocsPerRun(100, func() { e.BeginDispatch(ev); e.EndDispatch(ev) }); n != 0 {
		t.Errorf("dispatch hooks without an observer: %v allocations, want 0", n)
	}
	none, nop := perEvent(nil), perEvent(nopObserver{})
	t.Logf("allocations per event: %.2f without an observer, %.2f with one that does nothing", none, nop)
	if nop > none+0.5 {
		t.Errorf("the edges allocate: %.2f allocations per event with an observer that does nothing, %.2f without", nop, none)
	}
}
