package sinks_test

import (
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

type counter struct{ n int }

func (c *counter) Inc() { c.n++ }

// change builds an event with a fullDocument of doc bytes and, for an
// update, updatedFields of upd bytes and removedFields of rem bytes.
func change(t *testing.T, op string, doc, upd, rem int) *event.Event {
	t.Helper()
	d := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8201"}}},
		{Key: "operationType", Value: op},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "d"}, {Key: "coll", Value: "c"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: strings.Repeat("d", doc)}}},
	}
	if op == "update" {
		d = append(d, bson.E{Key: "updateDescription", Value: bson.D{
			{Key: "updatedFields", Value: bson.D{{Key: "v", Value: strings.Repeat("u", upd)}}},
			{Key: "removedFields", Value: bson.A{strings.Repeat("r", rem)}},
		}})
	}
	raw, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	e, err := event.FromChange("s", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestOversizeFit(t *testing.T) {
	const limit = 1000
	size := func(b []byte) int { return len(b) }
	for _, tc := range []struct {
		name      string
		e         *event.Event
		strip     bool
		want      string // substring of the payload; "" when refused
		notWant   string
		stripped  bool
		refusedOK bool
	}{
		{name: "fits", e: change(t, "insert", 10, 0, 0), want: `"v":"dddddddddd"`},
		{name: "fits, strip", e: change(t, "update", 10, 10, 10), strip: true, want: `"fullDocument"`, notWant: `"truncated":true`},
		{name: "insert over, deadletter", e: change(t, "insert", 2000, 0, 0), refusedOK: true},
		{name: "insert over, strip", e: change(t, "insert", 2000, 0, 0), strip: true, want: `"documentKey":{"_id":1},"rules":[],"truncated":true}`, notWant: "fullDocument", stripped: true},
		{name: "update, documents dropped", e: change(t, "update", 2000, 10, 10), strip: true, want: `"updatedFields":{"v":"uuuuuuuuuu"}`, notWant: "fullDocument", stripped: true},
		{name: "update, updatedFields truncated", e: change(t, "update", 2000, 2000, 10), strip: true, want: `"updateDescription":{"updatedFields":{"truncated":true},"removedFields":["rrrrrrrrrr"]}`, stripped: true},
		{name: "update, removedFields truncated too", e: change(t, "update", 2000, 2000, 2000), strip: true, want: `"updateDescription":{"updatedFields":{"truncated":true},"removedFields":{"truncated":true}}`, stripped: true},
		{name: "update over, deadletter", e: change(t, "update", 2000, 2000, 2000), refusedOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s, r counter
			p := sinks.Oversize{Strip: tc.strip, Stripped: &s, Refused: &r}
			env, err := tc.e.Envelope(false)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Fit(tc.e, false, env, limit, size, "sink x", "body")
			if tc.refusedOK {
				var de *sinks.Error
				if !errors.As(err, &de) || !de.Permanent || de.Reason != "oversize" ||
					!strings.HasPrefix(err.Error(), "sink x: event s:8201: body is ") ||
					!strings.HasSuffix(err.Error(), "more than the request limit of 1000 bytes (max_request_bytes)") {
					t.Fatalf("Fit = %v, want a permanent oversize error", err)
				}
				if r.n != 1 {
					t.Errorf("refused counted %d times", r.n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Size != len(got.Body) || got.Size > limit || got.Stripped != tc.stripped {
				t.Errorf("payload size %d (body %d), stripped %v", got.Size, len(got.Body), got.Stripped)
			}
			if !strings.Contains(string(got.Body), tc.want) || tc.notWant != "" && strings.Contains(string(got.Body), tc.notWant) {
				t.Errorf("payload %s\nwant it to contain %s", got.Body, tc.want)
			}
			if s.n != 0 || r.n != 0 {
				t.Errorf("Fit counted (%d, %d): only Delivered counts stripped events", s.n, r.n)
			}
		})
	}
	// An update still too large after every level: refused, the message
	// giving the stripped size too.
	e := change(t, "update", 10, 10, 10)
	env, _ := e.Envelope(false)
	_, err := sinks.Oversize{Strip: true}.Fit(e, false, env, 100, size, "sink x", "body")
	if err == nil || !strings.Contains(err.Error(), " stripped, more than the request limit of 100 bytes") {
		t.Fatalf("Fit = %v", err)
	}
}

func TestOversizeDelivered(t *testing.T) {
	var c counter
	p := sinks.Oversize{Stripped: &c}
	stripped := []bool{true, false, true, true}
	p.Delivered(stripped, nil)
	if c.n != 3 {
		t.Fatalf("all delivered: %d", c.n)
	}
	c.n = 0
	p.Delivered(stripped, &sinks.BatchError{Failed: map[int]error{2: errors.New("x"), 1: errors.New("y")}})
	if c.n != 2 {
		t.Fatalf("batch error: %d, want 2", c.n)
	}
	c.n = 0
	p.Delivered(stripped, sinks.Retryable("http_503", 0, errors.New("503")))
	if c.n != 0 {
		t.Fatalf("whole failure: %d", c.n)
	}
	sinks.Oversize{}.Delivered(stripped, nil) // nil counter: no panic
}
