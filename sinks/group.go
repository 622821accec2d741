package sinks

import (
	"context"
	"fmt"

	"github.com/changegate/changegate/event"
)

type txnGroupKey struct{}

// WithTxnGroup returns ctx marking the batch of a Send as the events of one
// transaction (a sink with transactions = "group"), in transaction order.
// The delivery engine sets it; a sink that sends one request per call
// (webhook, Lambda) sends the whole batch as one JSON array, whatever its
// batch size, split into declared parts (TxnParts) only when its request
// size limit requires it. Sinks of batch APIs send consecutive entries in
// order, as they do any batch.
func WithTxnGroup(ctx context.Context) context.Context {
	return context.WithValue(ctx, txnGroupKey{}, true)
}

// TxnGroup reports whether ctx marks a Send's batch as one transaction's
// events (WithTxnGroup).
func TxnGroup(ctx context.Context) bool {
	v, _ := ctx.Value(txnGroupKey{}).(bool)
	return v
}

type txnPartKey struct{}

// TxnPart says which part of a transaction the batch of a grouped Send is,
// when the lane sends the transaction in several batches: one too large to
// be held whole goes out in parts as it is read (router/txn.go). The
// batch's first request is part First (counted from 1 over the whole
// transaction); Final marks the batch holding the transaction's last
// events: only its parts say how many there are. A sink that numbers its
// requests (webhook, Lambda: SplitTxn) sets Used to the number of parts it
// made of the batch; the lane numbers the next batch from First+Used. The
// same TxnPart is in the context of every attempt of the batch.
type TxnPart struct {
	First int
	Final bool
	Used  int
}

// WithTxnPart returns ctx marking a grouped Send's batch as part p of its
// transaction (with WithTxnGroup).
func WithTxnPart(ctx context.Context, p *TxnPart) context.Context {
	return context.WithValue(ctx, txnPartKey{}, p)
}

// TxnPartOf returns the TxnPart of ctx: nil when the batch is its whole
// transaction.
func TxnPartOf(ctx context.Context) *TxnPart {
	p, _ := ctx.Value(txnPartKey{}).(*TxnPart)
	return p
}

// TxnParts splits a transaction's envelopes (sizes[i] bytes each, entries
// for which ok[i] is false left out) into consecutive parts of at most
// maxBytes, counting each element's separator and the array's brackets as
// a JSON array body does. It returns the indexes of each part, in order.
func TxnParts(sizes []int, ok []bool, maxBytes int) [][]int {
	var parts [][]int
	var cur []int
	size := 2 // []
	for i, n := range sizes {
		if !ok[i] {
			continue
		}
		if len(cur) > 0 && size+n+1 > maxBytes {
			parts, cur, size = append(parts, cur), nil, 2
		}
		cur = append(cur, i)
		size += n + 1
	}
	if len(cur) > 0 {
		parts = append(parts, cur)
	}
	return parts
}

// SplitTxn splits the envelopes of a transaction's batch (envs[i] of
// sizes[i] bytes, those with ok[i] false left out) into the parts of
// TxnParts for maxBytes. When more than one part is needed, or the batch
// is itself a part of its transaction (tp not nil, TxnPartOf), the split is
// made with room for the part marks (event.TxnPartReserve) and each
// element of the transaction is replaced by a copy that says which part it
// is in (event.MarkTxnPart): parts tp.First, tp.First+1, ..., with their
// number only in the last batch's (tp.Final); tp.Used is set to the number
// of parts. built is the bytes of those copies.
func SplitTxn(batch []*event.Event, envs [][]byte, sizes []int, ok []bool, maxBytes int, tp *TxnPart) (parts [][]int, built int) {
	parts = TxnParts(sizes, ok, maxBytes)
	if len(parts) <= 1 && tp == nil {
		return parts, 0
	}
	reserved := make([]int, len(sizes))
	for i, n := range sizes {
		reserved[i] = n + event.TxnPartReserve
	}
	parts = TxnParts(reserved, ok, maxBytes)
	first, total := 1, len(parts)
	if tp != nil {
		first, total = tp.First, 0
		if tp.Final {
			total = tp.First + len(parts) - 1
		}
		tp.Used = len(parts)
	}
	for p, idx := range parts {
		for _, i := range idx {
			if t := batch[i].Txn; t != nil {
				envs[i] = event.MarkTxnPart(envs[i], t, first+p, total)
				built += len(envs[i])
			}
		}
	}
	return parts, built
}

// NotSent is the error of the entries of a batch that are not sent because
// an earlier call or part of the same batch failed with callErr (sending
// them would put them before the failed ones). A retryable callErr is
// returned as is: the entries go round again with it. A permanent one
// concerns the entries of its call only, so in a plain batch they fail
// with a retryable "not_sent" error naming it. In a transaction's batch
// (txn, WithTxnGroup) a refused part refuses the transaction: the later
// parts fail for good with callErr's reason and text, and the engine
// dead-letters them with the refused part, at once. what names the
// operation ("webhook audit", "lambda fn: Invoke").
func NotSent(what string, callErr error, txn bool) error {
	de, ok := callErr.(*Error)
	if !ok || !de.Permanent {
		return callErr
	}
	if txn {
		return Permanent(de.Reason, fmt.Errorf("%s: not sent: an earlier part of the transaction was refused: %w", what, callErr))
	}
	return Retryable("not_sent", 0, fmt.Errorf("%s: not sent after an earlier call for the same batch failed: %w", what, callErr))
}
