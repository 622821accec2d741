package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

const (
	benchDB     = "bench"
	benchColl   = "orders"
	benchSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

var statuses = []string{"pending", "paid", "shipped", "delivered", "cancelled"}

// benchDoc is an order of about 300 bytes of BSON. seq numbers the
// benchmark's changes (the receiver counts and de-duplicates them), b is
// seq % 10 (rule filters select b = 0: 10% of the changes) and wts is the
// write time in unix nanoseconds (the receiver's latency reference).
func benchDoc(seq int, wts int64) bson.D {
	return bson.D{
		{Key: "_id", Value: int32(seq)},
		{Key: "seq", Value: int32(seq)},
		{Key: "customer", Value: fmt.Sprintf("customer-%06d", seq%50000)},
		{Key: "status", Value: statuses[seq%len(statuses)]},
		{Key: "total", Value: float64(seq%1000) + 0.99},
		{Key: "currency", Value: "EUR"},
		{Key: "items", Value: bson.A{
			bson.D{{Key: "sku", Value: fmt.Sprintf("SKU-%05d", seq%977)}, {Key: "qty", Value: int32(1 + seq%3)}, {Key: "price", Value: 19.99}},
			bson.D{{Key: "sku", Value: fmt.Sprintf("SKU-%05d", seq%311)}, {Key: "qty", Value: int32(1)}, {Key: "price", Value: 5.5}},
		}},
		{Key: "shipping", Value: bson.D{{Key: "city", Value: "Lyon"}, {Key: "zip", Value: "69002"}, {Key: "country", Value: "FR"}}},
		{Key: "b", Value: int32(seq % 10)},
		{Key: "wts", Value: wts},
	}
}

// writeBacklog inserts documents first..first+n-1 with InsertMany from two
// concurrent writers, as fast as the server takes them.
func writeBacklog(ctx context.Context, coll *mongo.Collection, first, n int) error {
	const chunk = 1000
	const writers = 2
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			docs := make([]any, 0, chunk)
			for c := first + w*chunk; c < first+n; c += writers * chunk {
				docs = docs[:0]
				now := time.Now().UnixNano()
				for i := c; i < min(c+chunk, first+n); i++ {
					docs = append(docs, benchDoc(i, now))
				}
				if _, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// writePaced inserts documents first..first+n-1 one by one at rate per
// second (from a few goroutines so that a slow insert does not delay the
// schedule), each stamped with its write time.
func writePaced(ctx context.Context, coll *mongo.Collection, first, n, rate int) error {
	const writers = 8
	interval := time.Second / time.Duration(rate)
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += writers {
				if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d)
				}
				if _, err := coll.InsertOne(ctx, benchDoc(first+i, time.Now().UnixNano())); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
