package event

import (
	"encoding/json"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// txnChange returns a change of a transaction on session sid (with uid when
// non-nil) number n.
func txnChange(t *testing.T, sid, uid []byte, n int64) bson.Raw {
	t.Helper()
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: sid}}}
	if uid != nil {
		lsid = append(lsid, bson.E{Key: "uid", Value: bson.Binary{Subtype: 0, Data: uid}})
	}
	raw, err := bson.Marshal(bson.D{
		{Key: "txnNumber", Value: n},
		{Key: "lsid", Value: lsid},
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8200000001000000010000000000000001"}}},
		{Key: "operationType", Value: "insert"},
		{Key: "clusterTime", Value: bson.Timestamp{T: 1700000000, I: 1}},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "total", Value: 5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestTxnID(t *testing.T) {
	sid := []byte("0123456789abcdef")
	uid := make([]byte, 32)
	a, ok := TxnID(txnChange(t, sid, uid, 7))
	if !ok || len(a) != 32 {
		t.Fatalf("TxnID = %q, %v", a, ok)
	}
	// Pinned: the id is a stored and delivered identifier; it must not
	// change between releases.
	if a != "de8b9cf81d7c6903ede6d4bfc318b432" {
		t.Errorf("TxnID changed: %s", a)
	}
	if b, _ := TxnID(txnChange(t, sid, uid, 7)); b != a {
		t.Errorf("not deterministic: %s vs %s", a, b)
	}
	for name, raw := range map[string]bson.Raw{
		"txnNumber": txnChange(t, sid, uid, 8),
		"session":   txnChange(t, []byte("0123456789abcdeX"), uid, 7),
		"uid":       txnChange(t, sid, append(make([]byte, 31), 1), 7),
		"no uid":    txnChange(t, sid, nil, 7),
	} {
		if b, ok := TxnID(raw); !ok || b == a {
			t.Errorf("%s: TxnID = %q, %v; want another id than %s", name, b, ok, a)
		}
	}
	single, _ := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: "82"}}}, {Key: "operationType", Value: "insert"}})
	if id, ok := TxnID(single); ok {
		t.Errorf("single write has txn id %q", id)
	}
	// A retryable write's lsid without txnNumber is not a transaction.
	noNumber, _ := bson.Marshal(bson.D{{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: sid}}}}})
	if _, ok := TxnID(noNumber); ok {
		t.Error("lsid without txnNumber has a txn id")
	}
}

// TestEnvelopeTxn checks "txn" in every envelope form and encoder, and
// its absence for single writes.
func TestEnvelopeTxn(t *testing.T) {
	raw := txnChange(t, []byte("0123456789abcdef"), nil, 3)
	for _, txn := range []*Txn{{ID: "abc", Index: 0}, {ID: "abc", Index: 4, Last: true}} {
		want := map[string]any{"id": "abc", "index": float64(txn.Index)}
		if txn.Last {
			want["last"] = true
		}
		e, err := FromChange("src", 1, raw)
		if err != nil {
			t.Fatal(err)
		}
		e.Txn = txn
		check := func(name string, b []byte, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var got struct {
				Txn map[string]any `json:"txn"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("%s: %v: %s", name, err, b)
			}
			if len(got.Txn) != len(want) {
				t.Fatalf("%s: txn = %v, want %v (%s)", name, got.Txn, want, b)
			}
			for k, v := range want {
				if got.Txn[k] != v {
					t.Fatalf("%s: txn = %v, want %v", name, got.Txn, want)
				}
			}
		}
		for _, canonical := range []bool{false, true} {
			b, err := e.Envelope(canonical)
			check("full", b, err)
			b, err = e.encodeDriver(canonical)
			check("full (driver)", b, err)
		}
		for form, f := range Forms {
			s, err := CompileShape(ShapeSpec{Envelope: f, Fields: []Field{{Path: "fullDocument.total", Include: true}}})
			if err != nil {
				t.Fatal(err)
			}
			v, _ := e.Shaped(s)
			b, err := v.Record(false)
			check(form+" record", b, err)
			if f != FormDocument {
				b, err = v.Envelope(false)
				check(form, b, err)
				continue
			}
			var meta string
			for _, m := range v.Metadata() {
				if m.Name == "txn" {
					meta = m.Value
				}
			}
			check("document metadata", []byte(`{"txn":`+meta+`}`), nil)
		}
	}
	e, _ := FromChange("src", 1, raw) // Txn not set: not part of the envelope
	b, _ := e.Envelope(false)
	if strings.Contains(string(b), `"txn"`) {
		t.Errorf("envelope without Txn has txn: %s", b)
	}
}

// TestEventTxnIDMatchesTxnID checks that FromChange's scan of the
// transaction fields gives (*Event).TxnID the answer of TxnID on the raw
// change, for transaction changes, single writes and odd fields alike.
func TestEventTxnIDMatchesTxnID(t *testing.T) {
	sid := []byte("0123456789abcdef")
	head := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "8200000001000000010000000000000001"}}},
		{Key: "operationType", Value: "insert"},
	}
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: sid}}}
	with := func(fields ...bson.E) bson.Raw {
		raw, err := bson.Marshal(append(append(bson.D{}, head...), fields...))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	cases := map[string]struct {
		raw  bson.Raw
		want bool
	}{
		"txn":                 {txnChange(t, sid, make([]byte, 32), 7), true},
		"txn no uid":          {txnChange(t, sid, nil, 7), true},
		"int32 txnNumber":     {with(bson.E{Key: "lsid", Value: lsid}, bson.E{Key: "txnNumber", Value: int32(3)}), true},
		"lsid without id":     {with(bson.E{Key: "lsid", Value: bson.D{{Key: "x", Value: 1}}}, bson.E{Key: "txnNumber", Value: int64(3)}), true},
		"single write":        {with(), false},
		"no txnNumber":        {with(bson.E{Key: "lsid", Value: lsid}), false},
		"no lsid":             {with(bson.E{Key: "txnNumber", Value: int64(3)}), false},
		"lsid not a document": {with(bson.E{Key: "lsid", Value: "s"}, bson.E{Key: "txnNumber", Value: int64(3)}), false},
		"double txnNumber":    {with(bson.E{Key: "lsid", Value: lsid}, bson.E{Key: "txnNumber", Value: 3.0}), false},
		"first lsid counts": {with(bson.E{Key: "lsid", Value: "s"}, bson.E{Key: "txnNumber", Value: int64(3)},
			bson.E{Key: "lsid", Value: lsid}), false},
		"first txnNumber counts": {with(bson.E{Key: "lsid", Value: lsid}, bson.E{Key: "txnNumber", Value: "3"},
			bson.E{Key: "txnNumber", Value: int64(3)}), false},
	}
	for name, c := range cases {
		ev, err := FromChange("s", 0, c.raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wantID, wantOK := TxnID(c.raw)
		if wantOK != c.want {
			t.Fatalf("%s: TxnID ok = %v, want %v", name, wantOK, c.want)
		}
		if id, ok := ev.TxnID(); id != wantID || ok != wantOK {
			t.Errorf("%s: (*Event).TxnID = %q, %v; TxnID = %q, %v", name, id, ok, wantID, wantOK)
		}
	}
	// An event not made by FromChange reads its Raw.
	raw := txnChange(t, sid, nil, 9)
	want, _ := TxnID(raw)
	if id, ok := (&Event{Raw: raw}).TxnID(); !ok || id != want {
		t.Errorf("event without FromChange: TxnID = %q, %v; want %q", id, ok, want)
	}
}
