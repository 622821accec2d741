package deadletter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
)

// A replay of large entries reads each one whole only once the byte budget
// in its context admits a whole entry: it waits while the budget is spent
// (by the live pipeline), charges what it read to the event it delivers,
// and returns every byte.
func TestReplayLargeEntriesUnderBudget(t *testing.T) {
	s, ctx := newStore(t)
	const size = 512 << 10
	pad := strings.Repeat("x", size)
	for i := range 3 {
		ts := bson.Timestamp{T: 1795000000 + uint32(i), I: 1}
		raw, err := bson.Marshal(bson.D{
			{Key: "_id", Value: bson.D{{Key: "_data", Value: "82" + strings.Repeat("0", 8) + string(rune('a'+i))}}},
			{Key: "operationType", Value: "insert"},
			{Key: "clusterTime", Value: ts},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: i}}},
			{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: i}, {Key: "pad", Value: pad}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		e, err := event.FromChange("orders", uint64(i), raw)
		if err != nil {
			t.Fatal(err)
		}
		put(t, ctx, s, entry(t, e, "a", deadletter.KindFailed))
	}
	b := memory.NewBudget(deadletter.MaxEntryBytes, nil, nil)
	live, _ := b.Acquire(ctx, deadletter.MaxEntryBytes, "live") // the pipeline holds it all
	var delivered int
	done := make(chan error, 1)
	go func() {
		res, err := s.Replay(memory.WithBudget(ctx, b), deadletter.Filter{}, func(_ context.Context, _ string, e *event.Event) error {
			if e.Mem.Bytes() < int64(len(e.Raw)) {
				t.Errorf("replayed event charged %d bytes, its change is %d", e.Mem.Bytes(), len(e.Raw))
			}
			if b.InUse() > deadletter.MaxEntryBytes {
				t.Errorf("%d bytes held during a replay in a budget of %d", b.InUse(), deadletter.MaxEntryBytes)
			}
			delivered++
			return nil
		})
		if err == nil && res.Replayed != 3 {
			t.Errorf("replayed %+v", res)
		}
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for b.Waiting().IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("the replay did not wait for the spent budget")
		}
		time.Sleep(time.Millisecond)
	}
	live.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if delivered != 3 {
		t.Fatalf("delivered %d of 3", delivered)
	}
	if b.InUse() != 0 || b.Charges() != 0 {
		t.Fatalf("after the replay the budget holds %d bytes in %d charges", b.InUse(), b.Charges())
	}
}
