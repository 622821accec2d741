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
// TxnParts for maxBytes. When more than one part is needed, the split is
// made with room for the part marks (event.TxnPartReserve) and each
// element of the transaction is replaced by a copy that says which part it
// is in (event.MarkTxnPart); built is the bytes of those copies.
func SplitTxn(batch []*event.Event, envs [][]byte, sizes []int, ok []bool, maxBytes int) (parts [][]int, built int) {
	parts = TxnParts(sizes, ok, maxBytes)
	if len(parts) <= 1 {
		return parts, 0
	}
	reserved := make([]int, len(sizes))
	for i, n := range sizes {
		reserved[i] = n + event.TxnPartReserve
	}
	parts = TxnParts(reserved, ok, maxBytes)
	for p, idx := range parts {
		for _, i := range idx {
			if t := batch[i].Txn; t != nil {
				envs[i] = event.MarkTxnPart(envs[i], t, p+1, len(parts))
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
