// Package sinktest is what the sinks' tests share: change events (Change,
// FromDoc, Txn, DocumentForm), opening a sink for a test (Open), checking
// Send's errors (CheckError, BatchFailures, CheckServerFaults), the byte
// budget of a Send (CheckBudget) and traced Sends (TracedSend).
package sinktest

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

// Change returns the n-th update event of source "orders" on shop.orders,
// for the document with _id docID, whose post-image carries customerId 42
// and a "pad" string of padding bytes. Its id is stable in n.
func Change(t testing.TB, n int, docID any, padding int) *event.Event {
	t.Helper()
	doc := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08d%s", n, strings.Repeat("A", 200))}}},
		{Key: "operationType", Value: "update"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "shop"}, {Key: "coll", Value: "orders"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: docID}}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: docID}, {Key: "customerId", Value: int32(42)}, {Key: "pad", Value: strings.Repeat("x", padding)}}},
	}
	return FromDoc(t, "orders", n, doc)
}

// Changes returns n events of Change, event i for document i.
func Changes(t testing.TB, n, padding int) []*event.Event {
	out := make([]*event.Event, n)
	for i := range out {
		out[i] = Change(t, i, i, padding)
	}
	return out
}

// Counter is a sinks.Counter that counts, safe for concurrent use.
type Counter struct {
	mu sync.Mutex
	n  int
}

// Inc adds one.
func (c *Counter) Inc() { c.mu.Lock(); c.n++; c.mu.Unlock() }

// N returns the count.
func (c *Counter) N() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }
