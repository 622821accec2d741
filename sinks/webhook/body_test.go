package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// TestReqBodyBytes: the body a request reads (through its reader, in reads
// of several sizes), hashes (signatures, SigV4) and reports as its length is,
// byte for byte, what sinks.AppendJSONArray makes of the same envelopes
// (the body batch requests carried before reqBody), and a single envelope
// as is.
func TestReqBodyBytes(t *testing.T) {
	envs := [][]byte{[]byte(`{"a":1}`), []byte(`{"b":"x,y"}`), {}, []byte(`{"c":[1,2,3]}`), []byte(`{}`)}
	var cases []reqBody
	var want [][]byte
	for n := 0; n <= len(envs); n++ {
		cases = append(cases, arrayBody(envs[:n]))
		want = append(want, sinks.AppendJSONArray(nil, envs[:n]...))
	}
	cases = append(cases, oneBody(envs[3]), oneBody(nil))
	want = append(want, envs[3], nil)
	for i, b := range cases {
		if got := b.bytes(); !bytes.Equal(got, want[i]) {
			t.Errorf("case %d: bytes %q, want %q", i, got, want[i])
		}
		if b.n != len(want[i]) {
			t.Errorf("case %d: n = %d, want %d", i, b.n, len(want[i]))
		}
		for _, size := range []int{1, 2, 3, 7, 4096} {
			r, _ := b.reader()
			if l := r.(interface{ Len() int }).Len(); l != len(want[i]) {
				t.Errorf("case %d: Len %d, want %d", i, l, len(want[i]))
			}
			got, err := readInChunks(r, size)
			if err != nil || !bytes.Equal(got, want[i]) {
				t.Errorf("case %d, reads of %d: %q, %v; want %q", i, size, got, err, want[i])
			}
		}
		r, _ := b.reader()
		if err := iotest.TestReader(r, want[i]); err != nil {
			t.Errorf("case %d: %v", i, err)
		}
		if got, w := b.sha256Hex(), sha256.Sum256(want[i]); got != hex.EncodeToString(w[:]) {
			t.Errorf("case %d: sha256 %s, want %x", i, got, w)
		}
		s, err := newSigner([]string{testSecret})
		if err != nil {
			t.Fatal(err)
		}
		wantSig := independentSig(t, testSecret, "id", "123", want[i])
		if got := string(s.appendSignatures(nil, "id", "123", &b)); got != wantSig {
			t.Errorf("case %d: signature %s, want %s", i, got, wantSig)
		}
	}
}

func readInChunks(r io.Reader, size int) ([]byte, error) {
	var out []byte
	buf := make([]byte, size)
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if n == 0 {
			return out, io.ErrNoProgress
		}
	}
}

// TestSendBatchBodies: the requests of a batched Send are, byte for byte,
// the arrays sinks.AppendJSONArray makes of the events' cached records
// (event.Event.Record), cut at max_request_bytes as before sendBatch built
// them while encoding, whether the events are their sink's alone
// (Exclusive: encoded straight into the request) or shared (cached), in
// both JSON formats, with events that cannot be encoded, that are over the
// limit (left out, or stripped) and that start a new request.
func TestSendBatchBodies(t *testing.T) {
	// The events: i%7 == 3 is not valid UTF-8, 0 and 13 are over the limit
	// (0 starts a request, stripped), the others of various sizes.
	raws := make([]bson.Raw, 24)
	for i := range raws {
		note := strings.Repeat("n", 40+(i*97)%900)
		switch {
		case i%7 == 3:
			note += "\xff"
		case i == 0 || i == 13:
			note = strings.Repeat("b", 5000)
		}
		raw, err := bson.Marshal(bson.D{
			{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("8266%016X", i)}}},
			{Key: "operationType", Value: "update"},
			{Key: "clusterTime", Value: bson.Timestamp{T: 1_700_000_000, I: uint32(i)}},
			{Key: "wallTime", Value: bson.NewDateTimeFromTime(t0.Add(time.Duration(i) * time.Millisecond))},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: int64(i) << 40}}},
			{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: int64(i) << 40}, {Key: "total", Value: 12.5 * float64(i)}, {Key: "note", Value: note}}},
			{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: bson.D{{Key: "note", Value: note}}}, {Key: "removedFields", Value: bson.A{}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		raws[i] = raw
	}
	events := func(exclusive func(i int) bool) []*event.Event {
		evs := make([]*event.Event, len(raws))
		for i, raw := range raws {
			e, err := event.FromChange("orders", uint64(i), raw)
			if err != nil {
				t.Fatal(err)
			}
			e.Rules = []string{"r"}
			e.Exclusive = exclusive(i)
			evs[i] = e
		}
		return evs
	}
	const limit = 4096
	for _, canonical := range []bool{false, true} {
		for _, strip := range []bool{false, true} {
			// What the requests must be: each event's cached record, fitted,
			// in arrays cut as sendBatch has always cut them.
			ref := events(func(int) bool { return false })
			var want [][]byte
			wantFailed := map[int]bool{}
			var cur [][]byte
			size, stripped := 2, 0
			for i, e := range ref {
				env, err := e.Record(canonical)
				if err != nil {
					wantFailed[i] = true
					continue
				}
				p, err := (sinks.Oversize{Strip: strip}).Fit(e, canonical, env, limit, arrayBodyLen, "x", "request body")
				if err != nil {
					wantFailed[i] = true
					continue
				}
				if p.Stripped {
					stripped++
				}
				if len(cur) > 0 && size+len(p.Body)+1 > limit {
					want, cur, size = append(want, sinks.AppendJSONArray(nil, cur...)), nil, 2
				}
				cur = append(cur, p.Body)
				size += len(p.Body) + 1
			}
			want = append(want, sinks.AppendJSONArray(nil, cur...))
			if len(want) < 3 || len(wantFailed) < 3 || strip != (stripped > 0) {
				t.Fatalf("the test's batch makes %d requests and %d failures: not the cases it is for", len(want), len(wantFailed))
			}
			for name, exclusive := range map[string]func(int) bool{
				"exclusive": func(int) bool { return true },
				"shared":    func(int) bool { return false },
				"mixed":     func(i int) bool { return i%2 == 0 },
			} {
				srv, rc := newServer(t, nil)
				w := newSink(t, Config{URL: srv.URL, BatchSize: 100, MaxRequestBytes: limit, Canonical: canonical, AllowPrivateNetworks: true,
					Oversize: sinks.Oversize{Strip: strip}})
				err := w.Send(context.Background(), events(exclusive))
				var be *sinks.BatchError
				if !errors.As(err, &be) || len(be.Failed) != len(wantFailed) {
					t.Fatalf("canonical %v, strip %v, %s: Send = %v, want %d failed", canonical, strip, name, err, len(wantFailed))
				}
				for i := range be.Failed {
					if !wantFailed[i] {
						t.Errorf("canonical %v, strip %v, %s: event %d failed: %v", canonical, strip, name, i, be.Failed[i])
					}
				}
				reqs := rc.requests()
				if len(reqs) != len(want) {
					t.Fatalf("canonical %v, strip %v, %s: %d requests, want %d", canonical, strip, name, len(reqs), len(want))
				}
				for k, r := range reqs {
					if !bytes.Equal(r.body, want[k]) {
						t.Errorf("canonical %v, strip %v, %s: request %d:\n got %s\nwant %s", canonical, strip, name, k, r.body, want[k])
					}
				}
			}
		}
	}
}
