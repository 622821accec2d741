package sinks

import "github.com/changegate/changegate/event"

// EncodeEnvelope returns the JSON envelope of e as the sinks whose payload
// is the envelope itself (webhook, lambda) send it. It is the one place
// those sinks get an event's bytes, so a change of the envelope's form
// applies to all of them. The result is cached by the event and must not
// be modified.
func EncodeEnvelope(e *event.Event, canonical bool) ([]byte, error) {
	return e.Envelope(canonical)
}

// EncodeRecord returns the payload of e as one self-contained JSON object
// (event.Event.Record): the envelope, except that a document-form payload
// (envelope = "document") carries its metadata beside fullDocument. It is
// what goes where there are no per-event headers: the elements of a batch
// (webhook, lambda) and an EventBridge detail. Cached like EncodeEnvelope.
func EncodeRecord(e *event.Event, canonical bool) ([]byte, error) {
	return e.Record(canonical)
}

// JSONArraySize returns the size of the JSON array of envelopes of the
// given sizes, as AppendJSONArray writes it: 2 bytes for the brackets
// and one comma between two envelopes.
func JSONArraySize(sizes ...int) int {
	n := 2
	for i, s := range sizes {
		if i > 0 {
			n++
		}
		n += s
	}
	return n
}

// AppendJSONArray appends the envelopes envs (each a JSON value, see
// EncodeEnvelope) to dst as one JSON array, the body of a batch request,
// and returns the extended buffer.
func AppendJSONArray(dst []byte, envs ...[]byte) []byte {
	dst = append(dst, '[')
	for i, env := range envs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, env...)
	}
	return append(dst, ']')
}
