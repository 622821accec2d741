package deliverylog_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deliverylog"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/test/mongotest"
	"github.com/changegate/changegate/test/mongowire"
)

func TestWantsByMode(t *testing.T) {
	var off *deliverylog.Writer
	if deliverylog.NewWriter(nil, deliverylog.WriterOptions{Mode: "off"}) != nil {
		t.Fatal(`mode "off" made a writer`)
	}
	if off.Wants(deliverylog.OutcomeRetrying) || off.Enqueue(deliverylog.Record{Outcome: deliverylog.OutcomeRetrying}) {
		t.Error("a nil writer takes records")
	}
	failures := deliverylog.NewWriter(nil, deliverylog.WriterOptions{Mode: "failures"})
	all := deliverylog.NewWriter(nil, deliverylog.WriterOptions{Mode: "all"})
	for _, o := range deliverylog.Outcomes {
		if got, want := failures.Wants(o), o != deliverylog.OutcomeDelivered; got != want {
			t.Errorf("failures.Wants(%s) = %v, want %v", o, got, want)
		}
		if !all.Wants(o) {
			t.Errorf("all.Wants(%s) = false", o)
		}
	}
	if failures.Enqueue(deliverylog.Record{Outcome: deliverylog.OutcomeDelivered}) {
		t.Error(`mode "failures" queued a success`)
	}
}

// A record goes to MongoDB with every field, and List reads it back.
func TestWriteAndList(t *testing.T) {
	l, ctx := newLog(t, "all", deliverylog.Deps{})
	e := ev(t, "orders", "orders", 42, 1, "paid", "audit")
	r := deliverylog.FromEvent(e, "billing")
	r.Attempt, r.Outcome, r.Status, r.ErrorClass, r.Error = 3, deliverylog.OutcomeRetrying, 503, "http_503", "webhook billing: 503 Service Unavailable"
	r.Duration, r.Response, r.TraceID, r.Unit = 1500*time.Microsecond, "busy\x00\xff, try later", "4bf92f3577b34da6a3ce929d0e0e4736", "orders#1/4"
	r.Time = time.Date(2026, 11, 28, 10, 0, 0, 123e6, time.UTC)
	write(t, l, r)
	p, err := l.List(ctx, deliverylog.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Records) != 1 || p.Next != "" {
		t.Fatalf("List = %+v", p)
	}
	got := p.Records[0]
	want := r
	want.Replica = "r1"
	want.Response = "busy\uFFFD\uFFFD, try later"
	if got.EventID != want.EventID || got.Source != "orders" || got.DB != "shop" || got.Coll != "orders" || got.Operation != "update" ||
		got.Sink != "billing" || strings.Join(got.Rules, ",") != "paid,audit" || got.Attempt != 3 || got.Outcome != want.Outcome ||
		got.Status != 503 || got.ErrorClass != "http_503" || got.Error != want.Error || got.Duration != want.Duration ||
		got.Response != want.Response || got.TraceID != want.TraceID || got.Replica != "r1" || got.Unit != "orders#1/4" ||
		got.ClusterTime != e.ClusterTime || !got.Time.Equal(want.Time) || !bytes.Equal(got.DocumentKey, e.DocumentKey) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}
}

// A batch request is one record listing its events; a lifecycle of any of
// them finds it.
func TestBatchRecord(t *testing.T) {
	l, ctx := newLog(t, "all", deliverylog.Deps{})
	a, b := ev(t, "orders", "orders", 1, 1, "r1"), ev(t, "orders", "refunds", 2, 2, "r2")
	r := deliverylog.FromBatch([]*event.Event{a, b}, "bus")
	r.Attempt, r.Outcome = 1, deliverylog.OutcomeDelivered
	write(t, l, r)
	p, err := l.List(ctx, deliverylog.Filter{DocumentKey: b.DocumentKey})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Records) != 1 || len(p.Records[0].BatchIDs) != 2 || p.Records[0].BatchIDs[1] != b.ID || p.Records[0].Coll != "" ||
		p.Records[0].Operation != "update" || strings.Join(p.Records[0].Rules, ",") != "r1,r2" {
		t.Fatalf("batch record = %+v", p.Records)
	}
	lc, err := l.Lifecycle(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(lc.Sinks) != 1 || lc.Sinks[0].State != deliverylog.StateDelivered || lc.Sinks[0].Attempts[0].Batch != 2 {
		t.Errorf("lifecycle of a batch's event = %+v", lc)
	}
}

// A key field the sink's shape redacts is stored as the shape shows it,
// never in clear, in the key and anywhere else in the document.
func TestRedactedKeyNeverStored(t *testing.T) {
	l, ctx := newLog(t, "failures", deliverylog.Deps{})
	for _, hash := range []bool{false, true} {
		shape, err := event.CompileShape(event.ShapeSpec{Redact: []string{"fullDocument.email"}, RedactHash: hash, RedactKey: []byte("k-0123456789abcdef")})
		if err != nil {
			t.Fatal(err)
		}
		base := ev(t, "orders", "orders", 7, 1, "paid")
		view, _ := base.Shaped(shape)
		r := deliverylog.FromEvent(view, "billing")
		r.Attempt, r.Outcome = 1, deliverylog.OutcomeDeadLettered
		write(t, l, r)
		redacted, _ := shape.RedactKey(base.DocumentKey)
		p, err := l.List(ctx, deliverylog.Filter{DocumentKey: redacted})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) != 1 {
			t.Fatalf("hash %v: records of the redacted key: %d, want 1", hash, len(p.Records))
		}
		if p, _ := l.List(ctx, deliverylog.Filter{DocumentKey: base.DocumentKey}); len(p.Records) != 0 {
			t.Errorf("hash %v: the clear key finds a record", hash)
		}
		if _, err := l.Collection().DeleteMany(ctx, bson.D{}); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing stored holds the clear value (checked before the delete above
	// by the key queries; here on raw documents of one more write).
	shape, _ := event.CompileShape(event.ShapeSpec{Redact: []string{"fullDocument.email"}})
	view, _ := ev(t, "orders", "orders", 8, 2, "paid").Shaped(shape)
	r := deliverylog.FromEvent(view, "billing")
	r.Outcome = deliverylog.OutcomeSkipped
	write(t, l, r)
	cur, err := l.Collection().Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var docs []bson.Raw
	if err := cur.All(ctx, &docs); err != nil || len(docs) != 1 {
		t.Fatalf("stored = %d %v", len(docs), err)
	}
	if bytes.Contains(docs[0], []byte("ann@example.com")) {
		t.Errorf("the redacted key is stored in clear: %s", docs[0])
	}
}

// A full queue drops records and counts them; Enqueue returns at once
// whether or not the writer runs.
func TestFullQueueDropsAndCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	coll := testDB(t).Collection("deliveries")
	w := deliverylog.NewWriter(coll, deliverylog.WriterOptions{Mode: "failures", MaxQueuedRecords: 10, Registerer: reg})
	// Not started: nothing leaves the queue.
	r := deliverylog.Record{EventID: "orders:82", Sink: "billing", Outcome: deliverylog.OutcomeRetrying}
	queued := 0
	for range 100 {
		if w.Enqueue(r) {
			queued++
		}
	}
	if queued != 10 || w.Dropped() != 90 {
		t.Fatalf("queued %d, dropped %d; want 10 and 90", queued, w.Dropped())
	}
	if got := dropped(t, reg, "queue_full"); got != 90 {
		t.Errorf("changegate_delivery_log_dropped_total{reason=queue_full} = %v, want 90", got)
	}
	// The byte bound too: one record with a 1 KiB answer fills a small one.
	wb := deliverylog.NewWriter(coll, deliverylog.WriterOptions{Mode: "failures", MaxQueuedBytes: 3000})
	big := r
	big.Response = strings.Repeat("x", 5000)
	first, second, third := wb.Enqueue(big), wb.Enqueue(big), wb.Enqueue(big)
	if !first || !second || third {
		t.Errorf("the byte bound: two records of ~1.4 KiB fit in 3000 bytes, a third does not (dropped %d)", wb.Dropped())
	}
	// Started, the queue drains into MongoDB.
	w.Start()
	if err := w.Stop(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n, _ := coll.CountDocuments(testCtx(t), bson.D{}); n != 10 || w.Written() != 10 {
		t.Errorf("written %d (stored %d), want 10", w.Written(), n)
	}
	if w.Enqueue(r) {
		t.Error("a stopped writer queued a record")
	}
}

// dropped returns changegate_delivery_log_dropped_total{reason} of reg.
func dropped(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "changegate_delivery_log_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no changegate_delivery_log_dropped_total{reason=%q}", reason)
	return 0
}

// MongoDB slow, then cut: Enqueue never waits for it; what does not fit is
// dropped, what cannot be written is counted, and writing resumes.
func TestSlowOrCutMongoDoesNotBlockEnqueue(t *testing.T) {
	uri, srv := mongotest.URI(t)
	if srv == nil {
		t.Skip("needs test/mongowire's fail points")
	}
	coll := mongotest.Client(t, uri).Database(mongotest.UniqueName("cgtest_deliverylog_")).Collection("deliveries")
	w := deliverylog.NewWriter(coll, deliverylog.WriterOptions{Mode: "failures", MaxQueuedRecords: 50, MaxBatch: 10,
		FlushEvery: time.Millisecond, WriteTimeout: 4 * time.Second})
	w.Start()
	defer w.Stop(testCtx(t))
	// The first insert hangs for 1s: far longer than the 200 calls below.
	// (With a deadline the driver retries a write cut off until the
	// deadline: WriteTimeout is how long a cut MongoDB holds a batch.)
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, Times: 1, BlockFor: time.Second})
	r := deliverylog.Record{EventID: "orders:82", Sink: "billing", Outcome: deliverylog.OutcomeRetrying}
	if !w.Enqueue(r) {
		t.Fatal("first record dropped")
	}
	waitFor(t, func() bool { return len(srv.CommandsNamed("insert")) == 1 }) // the write hangs
	// While it hangs, 49 more fit (the one being written counts), the rest
	// is dropped, and no call waits.
	done := make(chan int)
	go func() {
		n := 0
		for range 200 {
			if w.Enqueue(r) {
				n++
			}
		}
		done <- n
	}()
	select {
	case n := <-done:
		if n != 49 || w.Dropped() != 151 {
			t.Errorf("queued %d, dropped %d while MongoDB hangs; want 49 and 151", n, w.Dropped())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Enqueue waited for MongoDB")
	}
	waitFor(t, func() bool { return w.Written() == 50 }, "50 written", w)
	// Cut: the connection closes on every insert; those records are
	// dropped as write_failed, Enqueue still returns at once.
	srv.FailCommand(mongowire.FailPoint{Commands: []string{"insert"}, CloseConnection: true})
	before := w.Dropped()
	for range 5 {
		w.Enqueue(r)
	}
	waitFor(t, func() bool { return w.Dropped() == before+5 }, "5 more dropped", func() string { return fmt.Sprint(before, w.Dropped(), w.Written()) })
	srv.ClearFailPoints()
	w.Enqueue(r)
	waitFor(t, func() bool { return w.Written() == 51 }, "51 written", w)
}

func waitFor(t *testing.T, cond func() bool, what ...any) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			for i, x := range what {
				if f, ok := x.(func() string); ok {
					what[i] = f()
				}
			}
			t.Fatalf("not within 30s: %v", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExcerpt(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"ok", "ok"},
		{"line 1\nline 2\tx", "line 1\nline 2\tx"},
		{"bell\a nul\x00 esc\x1b[31m cr\r", "bell\uFFFD nul\uFFFD esc\uFFFD[31m cr\uFFFD"},
		{"bad \xff\xfe utf8", "bad \uFFFD\uFFFD utf8"},
		{"héllo ✓", "héllo ✓"},
	} {
		if got := deliverylog.Excerpt([]byte(c.in)); got != c.want {
			t.Errorf("Excerpt(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := deliverylog.Excerpt([]byte(strings.Repeat("é", 1000))) // 2000 bytes
	if len(long) != 1024 || strings.ContainsRune(long, '\uFFFD') {
		t.Errorf("Excerpt of 2000 bytes: %d bytes (cut inside a character: %v)", len(long), strings.ContainsRune(long, '\uFFFD'))
	}
	bad := deliverylog.Excerpt(bytes.Repeat([]byte{0xff}, 1000)) // each byte 3 once replaced
	if len(bad) > 1024 {
		t.Errorf("Excerpt of 1000 invalid bytes: %d bytes, want at most 1024", len(bad))
	}
}
