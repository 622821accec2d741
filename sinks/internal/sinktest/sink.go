package sinktest

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// Open returns the sink newSink (a sink package's New) makes of cfg, after
// mod (nil: none) changed it, with no logger; it fails the test when New
// fails and closes the sink when the test ends.
func Open[C any, S interface{ Close() error }](t testing.TB, newSink func(C, *slog.Logger) (S, error), cfg C, mod func(*C)) S {
	t.Helper()
	if mod != nil {
		mod(&cfg)
	}
	s, err := newSink(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// CheckError fails the test (naming the check name) unless err is a
// *sinks.Error that is permanent as perm says, with reason reason. It
// returns that error (nil when err is none).
func CheckError(t testing.TB, name string, err error, perm bool, reason string) *sinks.Error {
	t.Helper()
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent != perm || de.Reason != reason {
		t.Errorf("%s: %v, want permanent=%v reason %q", name, err, perm, reason)
	}
	return de
}

// BatchFailures stops the test unless err is a *sinks.BatchError with n
// failed entries, and returns it.
func BatchFailures(t testing.TB, err error, n int) *sinks.BatchError {
	t.Helper()
	var be *sinks.BatchError
	if !errors.As(err, &be) || len(be.Failed) != n {
		t.Fatalf("err = %v, want a batch error with %d failed entries", err, n)
	}
	return be
}

// HeldBody is a want of CheckBudget for a sink whose budget holds, during
// its call, exactly the request body the hook sees, which is at least
// minBody bytes.
func HeldBody(minBody int64) func(held, body int64) string {
	return func(held, body int64) string {
		if body < minBody || held != body {
			return "want the body's bytes, exactly"
		}
		return ""
	}
}

// FromDoc returns the event of change document doc, read from source
// source with sequence n (event.FromChange), failing the test on an error.
func FromDoc(t testing.TB, source string, n int, doc bson.D) *event.Event {
	t.Helper()
	raw, err := bson.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	e, err := event.FromChange(source, uint64(n), raw)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// DocumentForm returns e shaped with envelope = "document" (the
// post-image, its metadata beside it or in attributes).
func DocumentForm(t testing.TB, e *event.Event) *event.Event {
	t.Helper()
	shape, err := event.CompileShape(event.ShapeSpec{Envelope: event.FormDocument})
	if err != nil {
		t.Fatal(err)
	}
	s, skip := e.Shaped(shape)
	if skip {
		t.Fatal("the document form skips the event")
	}
	return s
}

// TxnID is the transaction id Txn gives events.
const TxnID = "0123456789abcdef0123456789abcdef"

// Txn makes evs, in order, the events of one multi-document transaction
// (event.Txn: id TxnID, their index, the last one marked) and returns
// them. Send them under sinks.WithTxnGroup as one group.
func Txn(evs []*event.Event) []*event.Event {
	for i, e := range evs {
		e.Txn = &event.Txn{ID: TxnID, Index: i, Last: i == len(evs)-1}
	}
	return evs
}

// Faults is what CheckServerFaults makes a test/aws server do.
type Faults interface {
	Throttle(n int)
	FailStatus(n, status int)
	Stall(d time.Duration)
}

// CheckServerFaults checks how an AWS sink classifies its server's
// faults: send is one Send of a sink of srv whose timeout is short (a few
// hundred milliseconds). Throttling must be retryable with reason
// "throttled", HTTP 500 retryable with reason code500 (the service's
// internal error code), 503 retryable "ServiceUnavailable" and a stalled
// call retryable "timeout". srv no longer stalls when it returns.
func CheckServerFaults(t testing.TB, srv Faults, code500 string, send func() error) {
	t.Helper()
	srv.Throttle(1)
	CheckError(t, "throttled", send(), false, "throttled")
	srv.FailStatus(1, 500)
	CheckError(t, "500", send(), false, code500)
	srv.FailStatus(1, 503)
	CheckError(t, "503", send(), false, "ServiceUnavailable")
	srv.Stall(time.Minute)
	defer srv.Stall(0)
	CheckError(t, "stalled", send(), false, "timeout")
}
