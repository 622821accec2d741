package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/changegate/changegate/test/otlp"
	"github.com/changegate/changegate/test/receiver"
	"github.com/changegate/changegate/tracing"
)

// TestProcessTraces runs the binary with OTEL_EXPORTER_OTLP_ENDPOINT set to
// an in-process OTLP receiver: every webhook request carries a valid
// traceparent, the request's span is the "send hook" span of a trace whose
// root is that event's read, and the trace has its delivery.
func TestProcessTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	col := otlp.NewReceiver()
	t.Cleanup(col.Close)
	rcv := receiver.New(testSecret)
	t.Cleanup(rcv.Close)
	// The first request of every third document fails: retries are traced too.
	var mu sync.Mutex
	seen := map[string]bool{}
	rcv.SetResponder(func(body []byte) *receiver.Response {
		mu.Lock()
		defer mu.Unlock()
		k := string(body)
		if len(seen)%3 == 0 && !seen[k] {
			seen[k] = true
			return &receiver.Response{Status: 503}
		}
		seen[k] = true
		return nil
	})
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(baseConfig(rcv.URL(), ""))), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath, "OTEL_EXPORTER_OTLP_ENDPOINT="+col.URL, "OTEL_SERVICE_NAME=changegate-e2e",
		"OTEL_TRACES_EXPORTER=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_EXPORTER_OTLP_PROTOCOL=", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=",
		"OTEL_TRACES_SAMPLER=", "OTEL_SDK_DISABLED=", "OTEL_BSP_SCHEDULE_DELAY=200")
	cps, _ := e.stores(e.config(baseConfig(rcv.URL(), "")))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	const total = 30
	insertN(t, e.coll("items"), 0, total)
	waitFor(t, 30*time.Second, "every event delivered", func() bool {
		docs := map[string]bool{}
		for _, d := range rcv.Deliveries() {
			docs[d.DocKey] = true
		}
		return len(docs) >= total
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, p.out)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no exit within 20s of SIGTERM\n%s", p.out)
	}
	if errs := col.Errors(); len(errs) > 0 {
		t.Fatalf("OTLP receiver: %v", errs)
	}
	ds := rcv.Deliveries()
	retried := 0
	for _, d := range ds {
		sc, err := tracing.ParseTraceparent(d.Traceparent)
		if err != nil {
			t.Fatalf("delivery of %s: %v", d.ID, err)
		}
		tr := col.Trace(sc.TraceID().String())
		roots := otlp.Find(tr, "receive "+e.db+".items")
		if len(roots) != 1 || roots[0].Attrs["messaging.message.id"] != d.ID || roots[0].Service != "changegate-e2e" {
			t.Fatalf("delivery of %s: trace %s has no read span of the event: %+v", d.ID, sc.TraceID(), tr)
		}
		var send *otlp.Span
		sends := otlp.Find(tr, "send hook")
		for i := range sends {
			if sends[i].SpanID == sc.SpanID().String() {
				send = &sends[i]
			}
		}
		if send == nil || !strings.HasPrefix(send.Attrs["http.response.status_code"], "2") || send.Error {
			t.Fatalf("delivery of %s: traceparent %s is not a successful send span of its trace: %+v", d.ID, d.Traceparent, tr)
		}
		pub := otlp.Find(tr, "publish hook")
		if len(pub) != 1 || send.ParentID != pub[0].SpanID || pub[0].Attrs["changegate.outcome"] != "delivered" {
			t.Fatalf("delivery of %s: publish span %+v", d.ID, pub)
		}
		if send.Attrs["changegate.attempt"] != "1" {
			retried++
			if len(otlp.Find(tr, "send hook")) < 2 {
				t.Errorf("delivery of %s on attempt %s, but its trace has one send span", d.ID, send.Attrs["changegate.attempt"])
			}
		}
	}
	if retried == 0 {
		t.Errorf("no delivery was retried; the test proves less than it says")
	}
	t.Logf("%d deliveries, %d after a retry, %d spans", len(ds), retried, len(col.Spans()))
}
