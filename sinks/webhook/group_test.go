package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// A transaction goes out as one JSON array whatever batch_size says; one
// larger than max_request_bytes is split in order into parts whose
// elements carry "part" and "parts"; an event too large alone follows the
// oversize policy and is left out, the rest sent.
func TestSendGroup(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	txn := func(n int) []*event.Event {
		var evs []*event.Event
		for i := range n {
			e := testEvent(t, i+1)
			e.Txn = &event.Txn{ID: "0123456789abcdef0123456789abcdef", Index: i, Last: i == n-1}
			evs = append(evs, e)
		}
		return evs
	}
	type elem struct {
		ID  string `json:"id"`
		Txn struct {
			Index int  `json:"index"`
			Last  bool `json:"last"`
			Part  int  `json:"part"`
			Parts int  `json:"parts"`
		} `json:"txn"`
	}
	parse := func(b []byte) []elem {
		var out []elem
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("body is not an array: %v: %s", err, b)
		}
		return out
	}
	ctx := sinks.WithTxnGroup(context.Background())

	// batch_size 1: still one array of every event.
	w := newSink(t, Config{URL: srv.URL, MaxRequestBytes: 1 << 20, AllowPrivateNetworks: true})
	if err := w.Send(ctx, txn(5)); err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 1 {
		t.Fatalf("%d requests, want 1", len(bodies))
	}
	for i, e := range parse(bodies[0]) {
		if e.Txn.Index != i || e.Txn.Part != 0 || e.Txn.Parts != 0 || e.Txn.Last != (i == 4) {
			t.Fatalf("element %d: %+v", i, e)
		}
	}

	// Too large for one request: parts in order, each declared.
	bodies = nil
	w = newSink(t, Config{URL: srv.URL, MaxRequestBytes: 1500, AllowPrivateNetworks: true})
	if err := w.Send(ctx, txn(7)); err != nil {
		t.Fatal(err)
	}
	if len(bodies) < 2 {
		t.Fatalf("%d requests, want parts", len(bodies))
	}
	idx := 0
	for p, b := range bodies {
		if len(b) > 1500 {
			t.Errorf("part %d: %d bytes, over the limit", p+1, len(b))
		}
		for _, e := range parse(b) {
			if e.Txn.Index != idx || e.Txn.Part != p+1 || e.Txn.Parts != len(bodies) {
				t.Fatalf("part %d element %+v, want index %d of part %d/%d", p+1, e, idx, p+1, len(bodies))
			}
			idx++
		}
	}
	if idx != 7 {
		t.Fatalf("%d events sent, want 7", idx)
	}

	// An event too large alone: left out (oversize), the others sent.
	bodies = nil
	evs := txn(3)
	big := bigEvent(t, 2, 64<<10)
	big.Txn = &event.Txn{ID: evs[1].Txn.ID, Index: 1}
	evs[1] = big
	err := w.Send(ctx, evs)
	var be *sinks.BatchError
	if !asBatchError(err, &be) || len(be.Failed) != 1 || be.Failed[1] == nil {
		t.Fatalf("err = %v, want a batch error for entry 1", err)
	}
	if len(bodies) != 1 || len(parse(bodies[0])) != 2 {
		t.Fatalf("requests %d, want one with the 2 other events", len(bodies))
	}
}

func asBatchError(err error, be **sinks.BatchError) bool {
	b, ok := err.(*sinks.BatchError)
	*be = b
	return ok
}

// A refused part of a split transaction (400) fails, with the receiver's
// answer and for good, its own events and those of every later part, which
// are not sent; the earlier parts were accepted (not failed). A retryable
// answer fails the later parts with itself, retryable.
func TestSendGroupRefusedPart(t *testing.T) {
	for _, tc := range []struct {
		status int
		perm   bool
		reason string
	}{{http.StatusBadRequest, true, "http_400"}, {http.StatusServiceUnavailable, false, "http_503"}} {
		var mu sync.Mutex
		n := 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			mu.Lock()
			n++
			k := n
			mu.Unlock()
			if k == 2 {
				http.Error(w, "refused: part two", tc.status)
			}
		}))
		w := newSink(t, Config{URL: srv.URL, MaxRequestBytes: 1500, AllowPrivateNetworks: true})
		var evs []*event.Event
		for i := range 12 {
			e := testEvent(t, i+1)
			e.Txn = &event.Txn{ID: "0123456789abcdef0123456789abcdef", Index: i, Last: i == 11}
			evs = append(evs, e)
		}
		err := w.Send(sinks.WithTxnGroup(context.Background()), evs)
		srv.Close()
		if n != 2 {
			t.Fatalf("%d: %d requests, want 2 (none after the failed part)", tc.status, n)
		}
		var be *sinks.BatchError
		if !asBatchError(err, &be) {
			t.Fatalf("%d: err = %v, want a batch error", tc.status, err)
		}
		first := -1 // the first failed entry: the first of part 2
		for i := range evs {
			ferr, failed := be.Failed[i]
			if !failed {
				if first >= 0 {
					t.Fatalf("%d: entry %d not failed after failed entry %d", tc.status, i, first)
				}
				continue
			}
			if first < 0 {
				first = i
			}
			var de *sinks.Error
			if !errors.As(ferr, &de) || de.Permanent != tc.perm || de.Reason != tc.reason || !strings.Contains(de.Error(), "refused: part two") {
				t.Errorf("%d: entry %d: %v, want permanent=%v %s with the receiver's answer", tc.status, i, ferr, tc.perm, tc.reason)
			}
		}
		if first <= 0 || len(be.Failed) != len(evs)-first {
			t.Fatalf("%d: failed %d entries from %d, want every entry from the second part on", tc.status, len(be.Failed), first)
		}
	}
}
