package sinks

import (
	"strings"
	"testing"

	"github.com/changegate/changegate/event"
)

// A batch that is one part of a transaction sent in parts (TxnPart) is
// marked even when it fits one request: its requests are numbered on from
// First, "parts" only in the final batch, and Used says how many it made.
func TestSplitTxnPart(t *testing.T) {
	mk := func(i int) (*event.Event, []byte) {
		tx := &event.Txn{ID: "T", Index: i}
		return &event.Event{Txn: tx}, []byte(`{"id":"s:` + string(rune('a'+i)) + `","txn":` + tx.JSON() + `}`)
	}
	for _, c := range []struct {
		name   string
		tp     *TxnPart
		max    int
		want   []string // the txn object of each element
		parts  int
		usedTo int
	}{
		{"whole, one request", nil, 1000, []string{`{"id":"T","index":0}`, `{"id":"T","index":1}`}, 1, 0},
		{"middle part", &TxnPart{First: 3}, 1000, []string{`{"id":"T","index":0,"part":3}`, `{"id":"T","index":1,"part":3}`}, 1, 1},
		{"last part, split", &TxnPart{First: 3, Final: true}, 80, []string{`{"id":"T","index":0,"part":3,"parts":4}`, `{"id":"T","index":1,"part":4,"parts":4}`}, 2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var batch []*event.Event
			var envs [][]byte
			var sizes []int
			for i := range 2 {
				e, env := mk(i)
				batch, envs, sizes = append(batch, e), append(envs, env), append(sizes, len(env))
			}
			parts, _ := SplitTxn(batch, envs, sizes, []bool{true, true}, c.max, c.tp)
			if len(parts) != c.parts {
				t.Fatalf("%d parts, want %d", len(parts), c.parts)
			}
			for i, env := range envs {
				if !strings.Contains(string(env), `"txn":`+c.want[i]) {
					t.Fatalf("element %d: %s, want txn %s", i, env, c.want[i])
				}
			}
			if c.tp != nil && c.tp.Used != c.usedTo {
				t.Fatalf("Used %d, want %d", c.tp.Used, c.usedTo)
			}
		})
	}
}
