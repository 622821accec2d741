package chaos

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/test/receiver"
)

// The verifier runs in the default suite: it must catch what the campaign
// is meant to catch.

var v0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// env builds the envelope changegate would send for change c of doc.
func env(doc int32, c change, ms int) receiver.Delivery {
	id := fmt.Sprintf("items:%d-%s-%d", doc, c.Op, c.Seq)
	var body string
	switch c.Op {
	case "insert", "replace":
		body = fmt.Sprintf(`"fullDocument":{"_id":%d,"seq":%d,"g":1}`, doc, c.Seq)
	case "update":
		body = fmt.Sprintf(`"updateDescription":{"updatedFields":{"seq":%d,"g":1},"removedFields":[]}`, c.Seq)
	case "delete":
		body = fmt.Sprintf(`"fullDocumentBeforeChange":{"_id":%d,"seq":%d}`, doc, c.Seq)
	}
	e := fmt.Sprintf(`{"id":%q,"source":"items","operationType":%q,"documentKey":{"_id":%d},%s}`, id, c.Op, doc, body)
	return receiver.Delivery{WebhookID: id, ID: id, Operation: c.Op, Envelope: []byte(e), At: v0.Add(time.Duration(ms) * time.Millisecond)}
}

func TestVerify(t *testing.T) {
	ins1, upd2, upd3, del3, ins4 := change{Seq: 1, Op: "insert"}, change{Seq: 2, Op: "update"}, change{Seq: 3, Op: "update"}, change{Seq: 3, Op: "delete"}, change{Seq: 4, Op: "insert"}
	j := &journal{docs: map[int32][]change{7: {ins1, upd2, upd3, del3, ins4}}, total: 5}
	inOrder := func(cs ...change) []receiver.Delivery {
		var ds []receiver.Delivery
		for i, c := range cs {
			ds = append(ds, env(7, c, 1000*(i+1)))
		}
		return ds
	}
	for _, tc := range []struct {
		name    string
		ds      []receiver.Delivery
		ok      bool
		rewinds int
		dups    int
		want    []string // substrings of the details
	}{
		{name: "in order", ds: inOrder(ins1, upd2, upd3, del3, ins4), ok: true},
		{name: "replay after a restart", ds: inOrder(ins1, upd2, upd3, upd2, upd3, del3, ins4), ok: true, rewinds: 1, dups: 2},
		{name: "redelivery of the last change", ds: inOrder(ins1, upd2, upd3, del3, ins4, ins4), ok: true, rewinds: 1, dups: 1},
		{
			name: "a newer change overtakes older ones", ds: inOrder(ins1, del3, upd2, upd3, ins4),
			rewinds: 1, dups: 0,
			want: []string{"reorders (1)", "doc 7's delete of 3 delivered at +2.000 s before its changes update 2 … update 3 (2) (delivered later at +3.000 s … +4.000 s)",
				// then insert 4 right after the re-sent update 3 skips the
				// delete, delivered before: reported, as a consequence.
				"replay gaps (1)", "doc 7's insert 4 delivered at +5.000 s before its delete of 3"},
		},
		{
			name: "a change after the delete, never re-sent", ds: inOrder(ins1, upd2, upd3, del3, ins4, upd3),
			rewinds: 1, dups: 1,
			want: []string{"doc 7: last delivered update 3 (at +6.000 s), but its last change is insert 4"},
		},
		{
			name: "lost", ds: inOrder(ins1, upd2, del3, ins4),
			want: []string{"doc 7's update 3 (written at", "never delivered", "before its update 3 (never delivered later)"},
		},
		{
			name: "a replay that skips", ds: inOrder(ins1, upd2, upd3, del3, upd2, del3, ins4),
			rewinds: 1, dups: 2,
			want: []string{"replay gaps (1)", "all delivered before"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := verify(j, tc.ds, v0)
			details := r.Details(10)
			if r.OK() != tc.ok || r.Rewinds != tc.rewinds || r.Duplicates != tc.dups {
				t.Errorf("ok %v rewinds %d duplicates %d, want %v %d %d\n%s\n%s", r.OK(), r.Rewinds, r.Duplicates, tc.ok, tc.rewinds, tc.dups, r.Summary(), details)
			}
			for _, w := range tc.want {
				if !strings.Contains(details, w) {
					t.Errorf("details lack %q:\n%s", w, details)
				}
			}
		})
	}

	t.Run("webhook-id", func(t *testing.T) {
		ds := inOrder(ins1, upd2, upd3, del3, ins4, ins4)
		ds[5].WebhookID = "items:other"
		r := verify(j, ds, v0)
		if len(r.IDs) != 2 { // differs from the first delivery, and from the envelope's id
			t.Fatalf("webhook-id mismatches %d, want 2\n%s", len(r.IDs), r.Details(10))
		}
	})
	t.Run("batches", func(t *testing.T) {
		// ins1 and upd2 in one request, upd3..ins4 in another, then upd3
		// again in a batch of its own (a replay): a batch carries the id
		// of its envelopes, whichever batch a change is sent in again.
		ds := inOrder(ins1, upd2, upd3, del3, ins4, upd3, del3, ins4)
		for _, g := range [][]int{{0, 1}, {2, 3, 4}, {5, 6, 7}} {
			var ids []string
			for _, i := range g {
				ids = append(ids, ds[i].ID)
			}
			for _, i := range g {
				ds[i].WebhookID, ds[i].At = webhook.BatchID(ids), ds[g[0]].At
			}
		}
		if r := verify(j, ds, v0); !r.OK() || r.Rewinds != 1 || r.Duplicates != 3 {
			t.Fatalf("batches: %s\n%s", r.Summary(), r.Details(10))
		}
		for _, i := range []int{2, 3, 4} {
			ds[i].WebhookID = "batch_other" // the second batch's id is wrong
		}
		if r := verify(j, ds, v0); len(r.IDs) != 1 || !strings.Contains(r.Details(10), "batch of 3") {
			t.Fatalf("a wrong batch id: mismatches %d, want 1 (the batch of 3)\n%s", len(r.IDs), r.Details(10))
		}
	})
	t.Run("not in the journal", func(t *testing.T) {
		r := verify(j, append(inOrder(ins1, upd2, upd3, del3, ins4), env(8, ins1, 9000)), v0)
		if len(r.Unknown) != 1 {
			t.Fatalf("unknown %d, want 1\n%s", len(r.Unknown), r.Details(10))
		}
	})
}

func TestRetryAfterGaps(t *testing.T) {
	at := func(ms int) time.Time { return v0.Add(time.Duration(ms) * time.Millisecond) }
	reqs := []request{
		{EventID: "a", At: at(0), Status: http.StatusServiceUnavailable},
		{EventID: "b", At: at(10), Status: http.StatusServiceUnavailable},
		{EventID: "b", At: at(40), Status: http.StatusNoContent},   // 30 ms: too early
		{EventID: "a", At: at(1005), Status: http.StatusNoContent}, // 1005 ms
		{EventID: "c", At: at(1100), Status: http.StatusServiceUnavailable},
		{EventID: "c", At: at(1200), Status: http.StatusNoContent}, // after a restart: not measured
	}
	gaps := retryAfterGaps(reqs, []time.Time{at(1150)})
	if len(gaps) != 2 || gaps[0] != 30*time.Millisecond || gaps[1] != 1005*time.Millisecond {
		t.Fatalf("gaps %v, want [30ms 1.005s]", gaps)
	}
	if n := countBelow(gaps, time.Second); n != 1 {
		t.Fatalf("below 1 s: %d, want 1", n)
	}
}
