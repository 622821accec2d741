package testutil

import (
	"encoding/base64"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/deadletter"
)

// KeyBSON returns d as BSON in base64, as a document_key_bson parameter.
func KeyBSON(d bson.D) string {
	b, err := bson.Marshal(d)
	if err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// CheckDeadLetterFilter fails t unless f, accepted from raw, is safe to
// hand to MongoDB: its kind is valid and its document keys are valid BSON
// holding no query operator, at any depth.
func CheckDeadLetterFilter(t *testing.T, raw string, f deadletter.Filter) {
	t.Helper()
	if f.ExactDocumentKey != nil {
		if err := f.ExactDocumentKey.Validate(); err != nil {
			t.Fatalf("invalid exact document key accepted from %q: %v", raw, err)
		}
		if err := deadletter.CheckDocumentKey(f.ExactDocumentKey); err != nil {
			t.Fatalf("operator in exact document key accepted from %q: %v", raw, err)
		}
	}
	if f.Kind != "" && !f.Kind.Valid() {
		t.Fatalf("kind %q accepted from %q", f.Kind, raw)
	}
	if f.DocumentKey != nil {
		if err := f.DocumentKey.Validate(); err != nil {
			t.Fatalf("invalid document key accepted from %q: %v", raw, err)
		}
		if err := deadletter.CheckDocumentKey(f.DocumentKey); err != nil {
			t.Fatalf("operator in document key accepted from %q: %v", raw, err)
		}
	}
}
