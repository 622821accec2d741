// Package deliverylog owns the delivery log: a [Record] per delivery
// attempt (per request for a batching sink, listing its event ids), kept in
// a collection of the state database ([delivery_log] collection, default
// "deliveries") for a retention enforced by a TTL index; the [Writer] that
// gets records there off the delivery path; and the reads over them:
// [Log.List] (failed, retried, parked, slow deliveries, newest first, by
// cursor), [Log.Lifecycle] (what became of one event at each sink it was
// routed to, derived from the checkpoints and the dead-letter store where
// nothing was recorded) and [Log.Analytics] (counts and latency percentiles
// per sink and rule over a window).
//
// The log is a side channel. [Writer.Enqueue] never blocks and never
// waits for MongoDB: records go to a queue bounded in count and bytes, and
// one goroutine batches them into unordered InsertMany calls. When the
// queue is full, or a write fails, records are dropped and counted
// (changegate_delivery_log_dropped_total); nothing of the delivery, the
// checkpoint or /readyz depends on them.
//
// A record holds no payload: ids, names, the outcome, the receiver's status
// or error code, the duration and at most [MaxExcerpt] bytes of the
// receiver's answer as printable UTF-8. Its document key is the one the
// sink's shape shows, with the fields the shape redacts redacted
// ([FromEvent], [event.Shape.RedactKey]).
//
// In cluster mode records carry no fence: they are observations of
// attempts a replica really made, never read to move a checkpoint or an
// entry, so a stale replica's record is true history (it names its replica
// and unit). Lifecycle states that matter — delivered, dead-lettered,
// parked — are taken from the fenced stores where the log is silent.
//
// The stored format (field names in [Record]'s documentation) is read by
// the next release: a change comes with an upgrade test.
package deliverylog
