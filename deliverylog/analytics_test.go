package deliverylog_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/event"
)

func TestAnalytics(t *testing.T) {
	l, ctx := newLog(t, "all", deliverylog.Deps{})
	now := time.Now()
	var recs []deliverylog.Record
	// billing: 100 attempts in the last hour, 1..100 ms, every tenth failed
	// (retrying), on orders (insert) and refunds (update).
	for i := 1; i <= 100; i++ {
		e := ev(t, "orders", []string{"orders", "refunds"}[i%2], i, uint32(i), "paid")
		if i%2 == 0 {
			e.OperationType = "insert"
		}
		r := deliverylog.FromEvent(e, "billing")
		r.Attempt, r.Outcome, r.Duration, r.Time = 1, deliverylog.OutcomeDelivered, time.Duration(i)*time.Millisecond, now.Add(-time.Duration(i)*time.Second)
		if i%10 == 0 {
			r.Outcome = deliverylog.OutcomeRetrying
		}
		recs = append(recs, r)
	}
	// bus: a batch of 3 (rules paid and all) two hours ago, dead-lettered.
	b := deliverylog.FromBatch([]*event.Event{ev(t, "orders", "orders", 1, 1, "paid"), ev(t, "orders", "orders", 2, 2, "all"), ev(t, "orders", "users", 3, 3, "all")}, "bus")
	b.Attempt, b.Outcome, b.Duration, b.Time = 8, deliverylog.OutcomeDeadLettered, 2*time.Second, now.Add(-2*time.Hour)
	recs = append(recs, b)
	// Out of every window.
	old := deliverylog.FromEvent(ev(t, "orders", "orders", 9, 9, "paid"), "billing")
	old.Outcome, old.Time = deliverylog.OutcomeRetrying, now.Add(-8*24*time.Hour)
	recs = append(recs, old)
	write(t, l, recs...)

	a, err := l.Analytics(ctx, "1h", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Sinks) != 1 || len(a.Rules) != 1 {
		t.Fatalf("1h: sinks %+v rules %+v", a.Sinks, a.Rules)
	}
	g := a.Sinks[0]
	if g.Name != "billing" || g.Attempts != 100 || g.Events != 100 || g.ByOutcome[deliverylog.OutcomeDelivered] != 90 || g.ByOutcome[deliverylog.OutcomeRetrying] != 10 ||
		g.ByOperation["insert"] != 50 || g.ByOperation["update"] != 50 || g.ByCollection["shop.orders"] != 50 || g.ByCollection["shop.refunds"] != 50 {
		t.Errorf("billing 1h = %+v", g)
	}
	// Percentiles: the bucket bound at or above the true value, within 19%.
	for _, p := range []struct {
		name      string
		got, want float64
	}{{"p50", g.Latency.P50, 50}, {"p95", g.Latency.P95, 95}, {"p99", g.Latency.P99, 99}} {
		if p.got < p.want || p.got > p.want*1.19 {
			t.Errorf("%s = %v ms, want %v..%v", p.name, p.got, p.want, p.want*1.19)
		}
	}
	if g.Latency.Count != 100 || a.Rules[0].Name != "paid" || a.Rules[0].Attempts != 100 {
		t.Errorf("latency count %d, rules %+v", g.Latency.Count, a.Rules)
	}

	// 24h: the batch, counted once per rule, three events, collections mixed.
	a, err = l.Analytics(ctx, "24h", 3)
	if err != nil {
		t.Fatal(err)
	}
	var bus deliverylog.Group
	rules := map[string]deliverylog.Group{}
	for _, g := range a.Sinks {
		if g.Name == "bus" {
			bus = g
		}
	}
	for _, g := range a.Rules {
		rules[g.Name] = g
	}
	if bus.Attempts != 1 || bus.Events != 3 || bus.ByOutcome[deliverylog.OutcomeDeadLettered] != 3 || bus.ByCollection["(mixed)"] != 3 || bus.ByOperation["update"] != 3 ||
		bus.Latency.P99 < 2000 || bus.Latency.P99 > 2000*1.19 {
		t.Errorf("bus 24h = %+v", bus)
	}
	if rules["paid"].Attempts != 101 || rules["all"].Attempts != 1 || rules["all"].Events != 3 {
		t.Errorf("rules 24h = %+v", a.Rules)
	}
	if !coversSay(a.Covers, "dropped 3 records") || coversSay(a.Covers, "covers only") {
		t.Errorf("24h covers = %q", a.Covers)
	}

	// 7d is longer than the retention (72h): said so; the old record is out.
	a, err = l.Analytics(ctx, "7d", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !coversSay(a.Covers, "covers only its last 72h0m0s") {
		t.Errorf("7d covers = %q", a.Covers)
	}
	for _, g := range a.Sinks {
		if g.Name == "billing" && g.Attempts != 100 {
			t.Errorf("7d billing attempts = %d, want 100 (the 8-day-old one is out)", g.Attempts)
		}
	}
	if _, err := l.Analytics(ctx, "2h", 0); !errors.Is(err, deliverylog.ErrBadFilter) {
		t.Errorf("window 2h: %v, want ErrBadFilter", err)
	}
	// Mode "failures" says what it leaves out.
	lf := deliverylog.NewLog(l.Collection(), 72*time.Hour, "failures", deliverylog.Deps{})
	if a, err := lf.Analytics(ctx, "1h", 0); err != nil || !coversSay(a.Covers, "successful attempts are not recorded") {
		t.Errorf("failures covers = %q, %v", a.Covers, err)
	}
}

func coversSay(covers []string, s string) bool {
	for _, c := range covers {
		if strings.Contains(c, s) {
			return true
		}
	}
	return false
}
