package event

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// NewNotice returns an event that is not a change: an operational notice
// changegate sends about itself (a subscription disabled, recovered, or
// dead-lettering events: [subscriptions] events_sink), whose envelope is
// body (a JSON object) as given, in both formats. It has id, source and
// typ as ID, Source and OperationType, at as WallTime, and no namespace,
// document key or cluster time; no rule routes it and no shape applies.
func NewNotice(id, source, typ string, at time.Time, body []byte) *Event {
	raw := bson.Raw(bsoncore.NewDocumentBuilder().AppendString("operationType", typ).Build())
	e := &Event{ID: id, Source: source, OperationType: typ, WallTime: at, Raw: raw, noTxn: true}
	for _, l := range []*lazyJSON{&e.relaxed, &e.canonical} {
		l.once.Do(func() { l.b = body })
	}
	return e
}
