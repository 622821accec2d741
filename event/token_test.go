package event

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestTokenClusterTime(t *testing.T) {
	tok := func(data any) bson.Raw {
		b, err := bson.Marshal(bson.D{{Key: "_data", Value: data}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A token from MongoDB's documentation of its resume-token decoder:
	// timestamp {t: 1630438675, i: 1}.
	ts, ok := TokenClusterTime(tok("82612E8513000000012B022C0100296E5A1004A5093ABB38FE4B9EA67F01BB1A96D812463C5F6964003C5F5F5F78000004"))
	if !ok || ts != (bson.Timestamp{T: 1630438675, I: 1}) {
		t.Fatalf("got %v %v", ts, ok)
	}
	for _, bad := range []any{"", "82612E", "01612E8513000000012B", "zz612E8513000000012B", 42} {
		if _, ok := TokenClusterTime(tok(bad)); ok {
			t.Errorf("%v: decoded", bad)
		}
	}
}
