package sinks

import (
	"context"
	"errors"
	"fmt"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
)

// Counter is the part of a Prometheus counter an Oversize policy uses.
type Counter interface{ Inc() }

// Oversize is a sink's policy for an event whose payload is larger than the
// sink's limit (its max_request_bytes). The zero value dead-letters such an
// event (oversize = "deadletter"); with Strip (oversize = "strip") it is
// sent stripped (see Fit). Every sink that has a payload limit applies it
// through Fit, so the sinks agree on what is stripped and on the reason
// and message of a refusal.
type Oversize struct {
	// Strip sends a stripped envelope instead of refusing the event.
	Strip bool
	// Stripped counts events delivered stripped, Refused events failed as
	// oversize (and so dead-lettered). Either may be nil.
	Stripped, Refused Counter
}

// Payload is what a sink sends for one event.
type Payload struct {
	// Body is the envelope, whole or stripped. The whole envelope is the
	// event's cached one: it must not be modified.
	Body []byte
	// Size is Body's size as the sink counts it against its limit.
	Size int
	// Stripped is true when Body is a stripped envelope.
	Stripped bool
}

// Built returns the bytes a sink built for p: the stripped envelope's
// (made for this Send, not cached on the event, so not charged to it), 0
// for the event's own cached envelope.
func (p Payload) Built() int {
	if !p.Stripped {
		return 0
	}
	return cap(p.Body)
}

// Hold charges n bytes a sink built for one Send or one call (stripped
// payloads, a request body) to the byte budget in ctx (memory.WithBudget;
// none: not counted) with Budget.Force, as the webhook charges a batched
// body, and returns the release: call it once when the bytes are no longer
// used, whatever the outcome. n <= 0 charges nothing.
func Hold(ctx context.Context, n int64) (release func()) {
	if n <= 0 {
		return func() {}
	}
	return memory.FromContext(ctx).Force(n).Release
}

// stripLevels are tried in order by Fit.
var stripLevels = []event.StripLevel{event.StripDocuments, event.StripUpdatedFields, event.StripUpdateDescription}

// Fit returns the payload of e for a sink whose limit is limit bytes, env
// being e's envelope and size how the sink counts a body against the limit
// (e.g. an EventBridge entry counts its Source and DetailType too).
//
// An envelope within the limit is sent as is. Otherwise, with Strip, the
// first of these that fits is sent, marked "truncated": true: the envelope
// without fullDocument and fullDocumentBeforeChange; for a change with an
// updateDescription, also with updatedFields replaced by {"truncated":
// true}; then with every member of updateDescription replaced so. An event
// that does not fit fails with a permanent *Error, reason "oversize",
// whose message reads "<prefix>: event <id>: <what> is N bytes, more than
// the request limit of L bytes (max_request_bytes)".
func (p Oversize) Fit(e *event.Event, canonical bool, env []byte, limit int, size func([]byte) int, prefix, what string) (Payload, error) {
	n := size(env)
	if n <= limit {
		return Payload{Body: env, Size: n}, nil
	}
	msg := fmt.Sprintf("%s: event %s: %s is %d bytes", prefix, e.ID, what, n)
	if p.Strip {
		smallest := 0
		for _, l := range stripLevels {
			if l > event.StripDocuments && !e.StripsUpdateDescription(l) {
				break
			}
			b, err := e.StrippedEnvelope(canonical, l)
			if err != nil {
				return Payload{}, Permanent("encode", fmt.Errorf("%s: %w", prefix, err))
			}
			smallest = size(b)
			if smallest <= limit {
				return Payload{Body: b, Size: smallest, Stripped: true}, nil
			}
		}
		msg += fmt.Sprintf(", %d stripped", smallest)
	}
	if p.Refused != nil {
		p.Refused.Inc()
	}
	return Payload{}, Permanent("oversize", fmt.Errorf("%s, more than the request limit of %d bytes (max_request_bytes)", msg, limit))
}

// Delivered counts in Stripped the events of a batch that were sent
// stripped (stripped[i]) and that err, Send's result for the batch,
// reports delivered: every one when err is nil, those not failed in a
// *BatchError, none after any other error.
func (p Oversize) Delivered(stripped []bool, err error) {
	if p.Stripped == nil {
		return
	}
	if err == nil {
		for _, s := range stripped {
			if s {
				p.Stripped.Inc()
			}
		}
		return
	}
	p.deliveredSome(stripped, err)
}

// deliveredSome is Delivered after an error (apart, so that the error
// target does not escape to the heap on every call).
func (p Oversize) deliveredSome(stripped []bool, err error) {
	var be *BatchError
	if !errors.As(err, &be) {
		return
	}
	for i, s := range stripped {
		if _, failed := be.Failed[i]; s && !failed {
			p.Stripped.Inc()
		}
	}
}
