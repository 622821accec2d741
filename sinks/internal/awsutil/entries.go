package awsutil

import (
	"context"
	"fmt"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
)

// SendEntries is the body of a batching AWS sink's Send once it has
// checked that it is open and set its timeout: build makes the request
// entry of event i of batch from its payload (sinks.Oversize.Fit), or
// returns the error it fails with; the stripped payloads built are held
// against the byte budget (sinks.Hold) until SendEntries returns; the
// entries go out through SendInChunks (what names the operation; call makes
// one request with entries, those of the events batch[i] for i in idx, in
// order, a slice of its own that the request may keep, and reports failed
// entries through fail); oversize then counts the stripped events that were
// delivered.
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
			picked := make([]T, len(idx))
			for j, i := range idx {
				picked[j] = entries[i]
			}
			return call(ctx, picked, idx, fail)
		})
	oversize.Delivered(stripped, err)
	return err
}

// EnvelopeEntry builds the entry of a message sink (SNS, SQS) for e: its
// envelope, fitted to limit by o (sinks.Oversize.Fit) with the entry's
// size as entry counts it (body and attributes), or the permanent error e
// fails with. what names the entry in errors ("message").
func EnvelopeEntry[T any](o sinks.Oversize, e *event.Event, canonical bool, limit int, prefix, what string, entry func(body []byte) (T, int)) (ent T, p sinks.Payload, err error) {
	env, err := e.Envelope(canonical)
	if err != nil {
		return ent, p, sinks.Permanent("encode", fmt.Errorf("%s: %w", prefix, err))
	}
	p, err = o.Fit(e, canonical, env, limit, func(body []byte) (size int) {
		ent, size = entry(body)
		return size
	}, prefix, what)
	if err == nil && p.Stripped {
		ent, _ = entry(p.Body) // the one made for the body sent
	}
	return ent, p, err
}
