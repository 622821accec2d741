package deliverylog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
)

// The router's edges become records: a failed request with its answer, the
// retry that follows, the dead letter; a success only in mode "all"; a
// delivered edge never (its request is the record).
func TestObserverRecords(t *testing.T) {
	for _, mode := range []string{"failures", "all"} {
		t.Run(mode, func(t *testing.T) {
			l, ctx := newLog(t, mode, deliverylog.Deps{})
			w := deliverylog.NewWriter(l.Collection(), deliverylog.WriterOptions{Mode: mode, Replica: "r1", FlushEvery: time.Millisecond})
			w.Start()
			o := deliverylog.NewObserver(w)
			hook := observe.Sink{Name: "billing", Kind: "webhook"}
			a, b := ev(t, "orders", "orders", 1, 1, "paid"), ev(t, "orders", "orders", 2, 2, "paid")
			start := time.Now()
			// a: 503, retry, 400 permanent, dead-lettered.
			o.AttemptEnd(ctx, observe.Attempt{Sink: hook, Events: []*event.Event{a}, Number: 1, Start: start, Duration: 30 * time.Millisecond,
				Err: errors.New("webhook billing: 503"), Failure: observe.Failure{Reason: "http_503", Status: 503, Answer: "busy"}})
			o.Outcome(observe.Outcome{Kind: observe.Retrying, Sink: hook, Event: a, Attempts: 1, Failure: observe.Failure{Reason: "http_503", Status: 503}, Wait: time.Second})
			o.AttemptEnd(ctx, observe.Attempt{Sink: hook, Events: []*event.Event{a}, Number: 2, Duration: 5 * time.Millisecond,
				Err: errors.New("webhook billing: 400"), Failure: observe.Failure{Reason: "http_400", Status: 400, Permanent: true, Answer: "bad"}})
			o.Outcome(observe.Outcome{Kind: observe.DeadLettered, Sink: hook, Event: a, Attempts: 2, Reason: "http_400"})
			// b: delivered at once.
			o.AttemptEnd(ctx, observe.Attempt{Sink: hook, Events: []*event.Event{b}, Number: 1, Duration: 2 * time.Millisecond})
			o.Outcome(observe.Outcome{Kind: observe.Delivered, Sink: hook, Event: b, Attempts: 1})
			// A skip and a lost lease.
			o.Outcome(observe.Outcome{Kind: observe.Skipped, Sink: observe.Sink{Name: "audit"}, Event: b, Reason: "skipped_empty"})
			o.Outcome(observe.Outcome{Kind: observe.Dropped, Sink: observe.Sink{Name: "bus"}, Event: b, Attempts: 1, Reason: "lease_lost"})
			if err := w.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			p, err := l.List(ctx, deliverylog.Filter{Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for i := len(p.Records) - 1; i >= 0; i-- {
				r := p.Records[i]
				got = append(got, r.Sink+" "+r.EventID[len(r.EventID)-4:]+" "+string(r.Outcome)+" "+r.ErrorClass)
			}
			want := []string{
				"billing " + a.ID[len(a.ID)-4:] + " failed http_503", "billing " + a.ID[len(a.ID)-4:] + " retrying http_503",
				"billing " + a.ID[len(a.ID)-4:] + " failed http_400", "billing " + a.ID[len(a.ID)-4:] + " dead_lettered http_400",
			}
			if mode == "all" {
				want = append(want, "billing "+b.ID[len(b.ID)-4:]+" delivered ")
			}
			want = append(want, "audit "+b.ID[len(b.ID)-4:]+" skipped skipped_empty", "bus "+b.ID[len(b.ID)-4:]+" abandoned lease_lost")
			if len(got) != len(want) {
				t.Fatalf("records\n%q\nwant\n%q", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("record %d = %q, want %q", i, got[i], want[i])
				}
			}
			first := p.Records[len(p.Records)-1]
			if first.Status != 503 || first.Response != "busy" || first.Duration != 30*time.Millisecond || first.Attempt != 1 || first.Replica != "r1" {
				t.Errorf("first record = %+v", first)
			}
			lc, err := l.Lifecycle(ctx, a.ID)
			if err != nil || len(lc.Sinks) != 1 || lc.Sinks[0].State != deliverylog.StateDeadLettered || len(lc.Sinks[0].Attempts) != 4 {
				t.Errorf("lifecycle of a = %+v, %v", lc, err)
			}
		})
	}
	if deliverylog.NewObserver(nil) != nil {
		t.Error(`mode "off": an observer the router would call`)
	}
	_ = context.Background
}
