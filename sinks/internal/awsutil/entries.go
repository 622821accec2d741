package awsutil

import (
	"context"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// SendEntries is the body of a batching AWS sink's Send once it has
// checked that it is open and set its timeout: build makes the request
// entry of event i of batch from its payload (sinks.Oversize.Fit), or
// returns the error it fails with; the stripped payloads built are held
// against the byte budget (sinks.Hold) until SendEntries returns; the
// entries go out through SendInChunks (what names the operation, call makes
// one request with the entries at idx and reports failed entries through
// fail); oversize then counts the stripped events that were delivered.
// It returns what SendInChunks returns.
func SendEntries[T any](ctx context.Context, what string, batch []*event.Event, maxEntries, maxBytes int, oversize sinks.Oversize,
	build func(i int, e *event.Event) (T, sinks.Payload, error),
	call func(ctx context.Context, entries []T, idx []int, fail func(int, error)) error) error {
	var failed map[int]error
	entries := make([]T, len(batch))
	sizes := make([]int, len(batch))
	stripped := make([]bool, len(batch))
	built := 0
	for i, e := range batch {
		ent, p, err := build(i, e)
		if err != nil {
			if failed == nil {
				failed = make(map[int]error, len(batch))
			}
			failed[i] = err
			continue
		}
		entries[i], sizes[i], stripped[i] = ent, p.Size, p.Stripped
		built += p.Built()
	}
	// The stripped payloads built above, until the calls are over.
	defer sinks.Hold(ctx, int64(built))()
	err := SendInChunks(ctx, what, len(batch), sizes, maxEntries, maxBytes, failed,
		func(ctx context.Context, idx []int, fail func(int, error)) error {
			return call(ctx, entries, idx, fail)
		})
	oversize.Delivered(stripped, err)
	return err
}
