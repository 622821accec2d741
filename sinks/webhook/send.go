package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/internal/nozero"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/sinks"
)

func (w *Webhook) sendOne(ctx context.Context, e *event.Event) error {
	env, err := sinks.EncodeEnvelope(e, w.canonical)
	if err != nil {
		return sinks.Permanent("encode", fmt.Errorf("webhook %s: %w", w.name, err))
	}
	p, err := w.oversize.Fit(e, w.canonical, env, w.maxBytes, bodyLen, w.what, "request body")
	if err != nil {
		return err
	}
	release := sinks.Hold(ctx, int64(p.Built())) // a stripped body, made for this Send
	err = w.post(ctx, e.ID, oneBody(p.Body), e)
	release()
	w.oversize.Delivered([]bool{p.Stripped}, err)
	return err
}

// bodyLen is the size of the request body of a single envelope.
func bodyLen(env []byte) int { return len(env) }

// arrayBodyLen is the size of the request body of a batch of one envelope.
func arrayBodyLen(env []byte) int { return len(env) + 2 }

func (w *Webhook) sendEach(ctx context.Context, batch []*event.Event) error {
	var failed map[int]error
	for i, e := range batch {
		if err := w.sendOne(ctx, e); err != nil {
			if ctx.Err() != nil {
				return err
			}
			if failed == nil {
				failed = make(map[int]error)
			}
			failed[i] = err
		}
	}
	if failed != nil {
		return &sinks.BatchError{Failed: failed}
	}
	return nil
}

// sendBatch sends batch as JSON arrays of at most maxBytes each, in order
// (an event whose envelope alone makes a larger array follows the oversize
// policy); a request answered 413 is split and its parts sent again
// (postParts).
//
// The bodies are built as the envelopes are encoded: each envelope is
// appended to its request's array (event.Event.AppendRecord: the envelope
// of an event routed to this sink alone is encoded straight into the
// array, any other is copied from its event's cache), so a request is the
// one copy of its envelopes. The bodies are charged to the byte budget
// until Send returns.
func (w *Webhook) sendBatch(ctx context.Context, batch []*event.Event) (err error) {
	failed := map[int]error{}
	stripped := make([]bool, len(batch))
	defer func() { w.oversize.Delivered(stripped, err) }()
	built := 0 // stripped envelopes made for this Send, held until it returns
	var chunks []batchChunk
	spans := make([][2]int, len(batch)) // envelope i in its chunk's body
	cur := w.newChunk(batch)
	size := 2 // []
	for i, e := range batch {
		mark := len(cur.body)
		if len(cur.idx) > 0 {
			cur.body = append(cur.body, ',')
		}
		start := len(cur.body)
		// An array element has no headers of its own: a document-form
		// payload goes as its record (the metadata beside fullDocument).
		out, err := e.AppendRecord(cur.body, w.canonical)
		if err != nil {
			cur.body = cur.body[:mark]
			failed[i] = sinks.Permanent("encode", fmt.Errorf("webhook %s: %w", w.name, err))
			continue
		}
		p, err := w.oversize.Fit(e, w.canonical, out[start:], w.maxBytes, arrayBodyLen, w.what, "request body")
		if err != nil {
			cur.body = out[:mark]
			failed[i] = err
			continue
		}
		env := p.Body // out[start:], or a stripped envelope
		stripped[i] = p.Stripped
		built += p.Built()
		switch {
		case len(cur.idx) > 0 && size+len(env)+1 > w.maxBytes:
			// The envelope starts the next request (it is copied there;
			// ']' at mark, closing this one, does not overwrite it).
			cur.body = out[:mark]
			chunks = append(chunks, cur)
			cur, size = w.newChunk(batch[i:]), 2
			start = len(cur.body)
			cur.body = append(cur.body, env...)
		case p.Stripped:
			cur.body = append(out[:start], env...)
		default:
			cur.body = out
		}
		spans[i] = [2]int{start, len(cur.body)}
		cur.idx = append(cur.idx, i)
		size += len(env) + 1
	}
	if len(cur.idx) > 0 {
		chunks = append(chunks, cur)
	}
	envs := make([][]byte, len(batch))
	for k := range chunks {
		c := &chunks[k]
		c.body = append(c.body, ']')
		built += cap(c.body)
		for _, i := range c.idx {
			envs[i] = c.body[spans[i][0]:spans[i][1]:spans[i][1]]
		}
	}
	defer sinks.Hold(ctx, int64(built))()
	for _, c := range chunks {
		if err := w.postParts(ctx, batch, envs, c.idx, c.body, failed); err != nil {
			return err
		}
	}
	if len(failed) == 0 {
		return nil
	}
	// One error for every entry (one request that failed as a whole, say):
	// return it as is.
	var only error
	for _, err := range failed {
		if only == nil {
			only = err
		} else if err != only {
			only = nil
			break
		}
	}
	if only != nil && len(failed) == len(batch) {
		return only
	}
	return &sinks.BatchError{Failed: failed}
}

// batchChunk is one request of a batch being built by sendBatch: the
// indexes of its events and its body, '[' and their envelopes separated by
// ',' (sendBatch appends the ']').
type batchChunk struct {
	idx  []int
	body []byte
}

// newChunk starts a request for (at most) the events of batch, its body
// sized for their envelopes (appends grow it when that is not enough).
func (w *Webhook) newChunk(batch []*event.Event) batchChunk {
	n := 2
	for _, e := range batch {
		// Relaxed Extended JSON of a typical change is about its BSON's
		// size, canonical a third more (typed numbers and dates).
		r := len(e.Raw)
		if w.canonical {
			r += r / 2
		} else {
			r += r / 8
		}
		n += r + 32
		if n >= w.maxBytes {
			n = w.maxBytes
			break
		}
	}
	b := nozero.Bytes(n) // not cleared: the envelopes are appended to it
	return batchChunk{idx: make([]int, 0, len(batch)), body: append(b, '[')}
}

// sendGroup sends the events of one transaction (sinks.WithTxnGroup) as
// one JSON array, whatever the sink's batch size. An array larger than
// max_request_bytes is split in order into parts of at most that size, each
// element's "txn" then carrying "part" and "parts"; the parts are posted one
// after the other, and once one fails the later ones are not sent: they
// fail with the same error, so that a refused part (a permanent failure)
// dead-letters every later part with it at once (sinks.NotSent). An event whose
// envelope alone is too large follows the oversize policy and is left out
// (a permanent failure in the returned *sinks.BatchError).
func (w *Webhook) sendGroup(ctx context.Context, batch []*event.Event) (err error) {
	failed := map[int]error{}
	envs := make([][]byte, len(batch))
	sizes := make([]int, len(batch))
	ok := make([]bool, len(batch))
	stripped := make([]bool, len(batch))
	defer func() { w.oversize.Delivered(stripped, err) }()
	built := 0
	for i, e := range batch {
		env, err := sinks.EncodeRecord(e, w.canonical)
		if err != nil {
			failed[i] = sinks.Permanent("encode", fmt.Errorf("webhook %s: %w", w.name, err))
			continue
		}
		p, err := w.oversize.Fit(e, w.canonical, env, w.maxBytes-event.TxnPartReserve, arrayBodyLen, w.what, "request body")
		if err != nil {
			failed[i] = err
			continue
		}
		envs[i], sizes[i], ok[i], stripped[i] = p.Body, len(p.Body), true, p.Stripped
		built += p.Built()
	}
	pre := len(failed) // left out before any request
	// Split when too large: every element then says which part it is in.
	parts, marked := sinks.SplitTxn(batch, envs, sizes, ok, w.maxBytes, sinks.TxnPartOf(ctx))
	built += marked
	defer sinks.Hold(ctx, int64(built))()
	var callErr error
	for _, idx := range parts {
		if callErr != nil {
			nerr := sinks.NotSent("webhook "+w.name, callErr, true)
			for _, i := range idx {
				failed[i] = nerr
			}
			continue
		}
		ps := make([][]byte, len(idx))
		ids := make([]string, len(idx))
		for j, i := range idx {
			ps[j], ids[j] = envs[i], batch[i].ID
		}
		body := arrayBody(ps) // the one copy of the request, see reqBody
		mem := memory.FromContext(ctx).Force(int64(body.n))
		perr := w.post(ctx, BatchID(ids), body, nil)
		mem.Release()
		if perr != nil {
			if ctx.Err() != nil {
				return perr
			}
			callErr = perr
			for _, i := range idx {
				failed[i] = perr
			}
		}
	}
	switch {
	case len(failed) == 0:
		return nil
	case pre == 0 && len(parts) == 1 && callErr != nil:
		return callErr // the one request failed as a whole
	}
	return &sinks.BatchError{Failed: failed}
}

// postParts posts the envelopes at idx as one JSON array and records a
// failure per entry in failed. A 413 (Content Too Large) on more than one
// envelope splits them in halves, sent one after the other the same way,
// so only an event that is refused on its own is given up. It returns an
// error only when ctx ended.
//
// joined, if not nil, is the array of the envelopes at idx, built by
// sendBatch (and charged by it): it is sent as is. Otherwise the envelopes
// are joined into one (a part of a split request), charged to the byte
// budget while it is sent. Retries of the request, its signature and the
// HTTP client's rewinds read the body in place.
func (w *Webhook) postParts(ctx context.Context, batch []*event.Event, envs [][]byte, idx []int, joined []byte, failed map[int]error) error {
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = batch[i].ID
	}
	var body reqBody
	release := func() {}
	if joined != nil {
		body = oneBody(joined) // a prebuilt array is one slice of bytes
	} else {
		parts := make([][]byte, len(idx))
		for j, i := range idx {
			parts[j] = envs[i]
		}
		body = arrayBody(parts)
		release = memory.FromContext(ctx).Force(int64(body.n)).Release
	}
	err := w.post(ctx, BatchID(ids), body, nil)
	release()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	var se *sinks.Error
	if len(idx) > 1 && errors.As(err, &se) && se.Reason == "http_413" {
		w.log.DebugContext(ctx, "webhook batch too large for the receiver, splitting it", "events", len(idx), "bytes", body.n)
		mid := len(idx) / 2
		if err := w.postParts(ctx, batch, envs, idx[:mid], nil, failed); err != nil {
			return err
		}
		return w.postParts(ctx, batch, envs, idx[mid:], nil, failed)
	}
	for _, i := range idx {
		failed[i] = err
	}
	return nil
}

// BatchID returns the webhook-id of a batch request: "batch_" followed by
// the unpadded base64url of the first 18 bytes of the SHA-256 of the event
// ids, each followed by a NUL byte. It is stable: a re-delivery of the same
// events in the same order carries the same id, so receivers can
// de-duplicate batches as they de-duplicate single events; the events' own
// ids are in the envelopes ("id").
func BatchID(ids []string) string {
	n := 0
	for _, id := range ids {
		n += len(id) + 1
	}
	buf := make([]byte, 0, n) // one hash call: io.WriteString on a hash copies each id
	for _, id := range ids {
		buf = append(append(buf, id...), 0)
	}
	sum := sha256.Sum256(buf)
	var out [6 + 24]byte
	copy(out[:], "batch_")
	base64.RawURLEncoding.Encode(out[6:], sum[:18])
	return string(out[:])
}
