package event

import (
	"encoding/json"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// updateChange is an update with pre- and post-image and an
// updateDescription of every member.
func updateChange(t testing.TB, updated string) *Event {
	t.Helper()
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: "82"}}},
		{Key: "operationType", Value: "update"},
		{Key: "ns", Value: bson.D{{Key: "db", Value: "d"}, {Key: "coll", Value: "c"}}},
		{Key: "documentKey", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "updateDescription", Value: bson.D{
			{Key: "updatedFields", Value: bson.D{{Key: "v", Value: updated}}},
			{Key: "removedFields", Value: bson.A{"old"}},
			{Key: "truncatedArrays", Value: bson.A{bson.D{{Key: "field", Value: "arr"}, {Key: "newSize", Value: 1}}}},
		}},
		{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: updated}}},
		{Key: "fullDocumentBeforeChange", Value: bson.D{{Key: "_id", Value: 1}, {Key: "v", Value: "before"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := FromChange("s", 1, raw)
	if err != nil {
		t.Fatal(err)
	}
	e.Rules = []string{"r"}
	return e
}

func TestStripLevels(t *testing.T) {
	e := updateChange(t, "new")
	head := `{"id":"s:82","source":"s","operationType":"update","ns":{"db":"d","coll":"c"},"documentKey":{"_id":1},`
	tail := `,"rules":["r"],"truncated":true}`
	for _, tc := range []struct {
		level StripLevel
		ud    string
	}{
		{StripDocuments, `"updateDescription":{"updatedFields":{"v":"new"},"removedFields":["old"],"truncatedArrays":[{"field":"arr","newSize":1}]}`},
		{StripUpdatedFields, `"updateDescription":{"updatedFields":{"truncated":true},"removedFields":["old"],"truncatedArrays":[{"field":"arr","newSize":1}]}`},
		{StripUpdateDescription, `"updateDescription":{"updatedFields":{"truncated":true},"removedFields":{"truncated":true},"truncatedArrays":{"truncated":true}}`},
	} {
		for _, canonical := range []bool{false, true} {
			got, err := e.StrippedEnvelope(canonical, tc.level)
			if err != nil {
				t.Fatal(err)
			}
			want := head + tc.ud + tail
			if canonical {
				want = strings.ReplaceAll(want, `{"_id":1}`, `{"_id":{"$numberInt":"1"}}`)
				want = strings.ReplaceAll(want, `"newSize":1`, `"newSize":{"$numberInt":"1"}`)
			}
			if string(got) != want {
				t.Errorf("level %d canonical %v:\ngot  %s\nwant %s", tc.level, canonical, got, want)
			}
			if !json.Valid(got) {
				t.Errorf("level %d: invalid JSON", tc.level)
			}
		}
	}
	full, _ := e.Envelope(false)
	if !strings.Contains(string(full), `"fullDocument"`) || strings.Contains(string(full), `"truncated":true`) {
		t.Fatalf("the cached envelope changed: %s", full)
	}
	if !e.StripsUpdateDescription(StripUpdatedFields) || e.StripsUpdateDescription(StripDocuments) {
		t.Error("StripsUpdateDescription of an update")
	}
	ins := oddChange(t, func(b *bsoncore.DocumentBuilder) *bsoncore.DocumentBuilder { return b })
	if ins.StripsUpdateDescription(StripUpdateDescription) {
		t.Error("StripsUpdateDescription of an insert")
	}
}

// TruncatedMarker is the form max_updated_fields_bytes uses too.
func TestTruncatedMarker(t *testing.T) {
	b, err := bson.MarshalExtJSON(TruncatedMarker, false, false)
	if err != nil || string(b) != `{"truncated":true}` {
		t.Fatalf("%s %v", b, err)
	}
}
