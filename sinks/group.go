package sinks

import "context"

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
