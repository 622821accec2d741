package tracing

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
)

func spansByName(exp *tracetest.InMemoryExporter) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		out[s.Name] = append(out[s.Name], s)
	}
	return out
}

func attr(s tracetest.SpanStub, k string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == k {
			return a.Value.String()
		}
	}
	return ""
}

var hook = observe.Sink{Name: "hook", Kind: "webhook"}

// A replay's trace starts with its first attempt: a "replay" root linked
// to the event, its request a child, ended by its outcome (failed).
func TestObserverReplay(t *testing.T) {
	tr, exp := recorder(t, sdktrace.AlwaysSample())
	ev := &event.Event{ID: "orders:1", Source: "orders", DB: "shop", Coll: "orders", OperationType: "insert"}
	a := observe.Attempt{Sink: hook, Events: []*event.Event{ev}, Number: 1, Redelivery: observe.Replay, Start: time.Now()}
	ctx := tr.AttemptStart(context.Background(), a)
	if tp, _ := Entry(ctx, 0); tp == "" {
		t.Fatal("the replay's request carries no trace context")
	}
	a.Err, a.Failure = errors.New("HTTP 400"), observe.Failure{Reason: "http_400", Permanent: true, Status: 400}
	tr.AttemptEnd(ctx, a)
	tr.Outcome(observe.Outcome{Kind: observe.Failed, Sink: hook, Event: ev, Attempts: 1, Redelivery: observe.Replay, Reason: "http_400"})
	by := spansByName(exp)
	root, send := by["replay hook"], by["send hook"]
	if len(root) != 1 || len(send) != 1 {
		t.Fatalf("spans %v", by)
	}
	if send[0].Parent.SpanID() != root[0].SpanContext.SpanID() || attr(send[0], "error.type") != "http_400" {
		t.Errorf("send span %+v", send[0])
	}
	if attr(root[0], "changegate.outcome") != "failed" || len(root[0].Links) != 1 || root[0].Links[0].SpanContext.TraceID() != EventLink(ev.ID).SpanContext.TraceID() {
		t.Errorf("replay root %+v", root[0])
	}
	if id, sampled, ok := observe.TraceOf(ev); !ok || !sampled || id != observe.TraceID(root[0].SpanContext.TraceID()) {
		t.Errorf("TraceOf = %v %v %v, want the replay's trace", id, sampled, ok)
	}
}

// A park whose store write did not complete ends the delivery abandoned,
// with the failed write as an error span; the change is not acknowledged
// (its root stays open). A change routed nowhere is acknowledged at once.
func TestObserverAbandonedPark(t *testing.T) {
	tr, exp := recorder(t, sdktrace.AlwaysSample())
	ev := &event.Event{ID: "orders:1", Source: "orders", DB: "shop", Coll: "orders"}
	tr.Dispatched(observe.Dispatch{Event: ev, Rules: []string{"all"}, Targets: []int{0}, Sinks: []observe.Sink{hook}})
	tr.Outcome(observe.Outcome{Kind: observe.Abandoned, Sink: hook, Event: ev, Reason: "",
		Store: observe.StoreWrite{Op: "park", Start: time.Now(), Failed: true}})
	by := spansByName(exp)
	pub, park := by["publish hook"], by["park hook"]
	if len(pub) != 1 || attr(pub[0], "changegate.outcome") != "abandoned" {
		t.Errorf("publish spans %+v", pub)
	}
	if len(park) != 1 || park[0].Status.Description != "store write not completed" || park[0].Parent.SpanID() != pub[0].SpanContext.SpanID() {
		t.Errorf("park spans %+v", park)
	}
	if n := len(by["receive shop.orders"]); n != 0 {
		t.Errorf("the change's root ended (%d) though no sink finished it", n)
	}
	other := &event.Event{ID: "orders:2", Source: "orders", DB: "shop", Coll: "orders"}
	tr.Dispatched(observe.Dispatch{Event: other, Sinks: []observe.Sink{hook}})
	if n := len(spansByName(exp)["receive shop.orders"]); n != 1 {
		t.Errorf("%d roots ended, want the unrouted change's", n)
	}
}
