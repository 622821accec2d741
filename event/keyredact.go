package event

import "go.mongodb.org/mongo-driver/v2/bson"

// RedactKey returns the document key key as the shape's redactions would
// show the same fields of the document: a documentKey field x whose path
// fullDocument.x the shape redacts (a shard key that is also a redacted
// field) is replaced as the payload replaces it, by the mask or the HMAC.
// Projections do not apply: documentKey is never shaped in a payload. It
// returns key itself when no redaction applies to it (no copy) and for a
// nil shape; a malformed key is an error.
//
// It is for records kept beside the payload (the delivery log): nothing a
// sink's shape redacts is stored in clear.
func (s *Shape) RedactKey(key bson.Raw) (bson.Raw, error) {
	if s == nil || len(s.red) == 0 || len(key) == 0 {
		return key, nil
	}
	ks := &Shape{pats: s.pats, dotted: s.dotted, red: s.red}
	w := &walk{s: ks}
	out, err := w.appendDoc(make([]byte, 0, len(key)+32), key, ks.root(), 0)
	if err != nil {
		return nil, err
	}
	if string(out) == string(key) {
		return key, nil
	}
	return out, nil
}
