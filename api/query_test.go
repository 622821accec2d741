package api_test

import (
	"bytes"
	"encoding/base64"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/api"
)

// TestDeadLetterQueryDocumentKey: document_key (API) and -document-key
// (CLI) take the key's value as (Extended) JSON and refuse query
// operators, which would otherwise select more than one document.
func TestDeadLetterQueryDocumentKey(t *testing.T) {
	tests := []struct {
		key, err string
	}{
		{`{"_id": 42}`, ""},
		{`{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}}`, ""},
		{`{"_id": {"a": 1, "b": [1, 2]}}`, ""},
		{`{"_id": {"$ne": null}}`, `document key: "{\"_id\": {\"$ne\": null}}": field "_id.$ne" is a query operator: a document key is matched literally, write its value as (Extended) JSON, e.g. {"_id": {"$oid": "..."}}`},
		{`{"_id": {"$regex": "^a"}}`, `document key: "{\"_id\": {\"$regex\": \"^a\"}}": field "_id.$regex" is a query operator: a document key is matched literally, write its value as (Extended) JSON, e.g. {"_id": {"$oid": "..."}}`},
		{`{"$where": "1"}`, `document key: "{\"$where\": \"1\"}": field "$where" is a query operator: a document key is matched literally, write its value as (Extended) JSON, e.g. {"_id": {"$oid": "..."}}`},
		{`{"_id": [{"$gt": 1}]}`, `document key: "{\"_id\": [{\"$gt\": 1}]}": field "_id.0.$gt" is a query operator: a document key is matched literally, write its value as (Extended) JSON, e.g. {"_id": {"$oid": "..."}}`},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			_, err := api.DeadLetterQuery{DocumentKey: tt.key}.Filter(time.Now(), 0)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.err {
				t.Errorf("error\n got %s\nwant %s", got, tt.err)
			}
		})
	}
}

// TestDeadLetterQueryDocumentKeyBSON: document_key_bson takes a listing's
// documentKeyBSON (the key's raw BSON, base64) for an exact look-up.
func TestDeadLetterQueryDocumentKeyBSON(t *testing.T) {
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: "a\xffb"}})
	f, err := api.DeadLetterQuery{DocumentKeyBSON: base64.StdEncoding.EncodeToString(key)}.Filter(time.Now(), 0)
	if err != nil || !bytes.Equal(f.ExactDocumentKey, key) {
		t.Fatalf("Filter = %v, %v", f.ExactDocumentKey, err)
	}
	op, _ := bson.Marshal(bson.D{{Key: "_id", Value: bson.D{{Key: "$ne", Value: nil}}}})
	for _, tt := range []struct {
		q    api.DeadLetterQuery
		want string
	}{
		{api.DeadLetterQuery{DocumentKeyBSON: "!!"}, `document key bson: "!!" is not the base64 of a BSON document (copy documentKeyBSON from a listing)`},
		{api.DeadLetterQuery{DocumentKeyBSON: base64.StdEncoding.EncodeToString(key), DocumentKey: `{"_id":1}`}, `document key: give document_key or document_key_bson, not both`},
		{api.DeadLetterQuery{DocumentKeyBSON: base64.StdEncoding.EncodeToString(op)}, `document key bson: field "_id.$ne" is a query operator: a document key is matched literally, write its value as (Extended) JSON, e.g. {"_id": {"$oid": "..."}}`},
	} {
		if _, err := tt.q.Filter(time.Now(), 0); err == nil || err.Error() != tt.want {
			t.Errorf("Filter(%+v) = %v, want %s", tt.q, err, tt.want)
		}
	}
}
